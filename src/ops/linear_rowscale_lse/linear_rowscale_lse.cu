// F5 dispatch (host only, no CUTLASS): pick the kernel (with or without stored logits), carve the partials out of
// the caller's workspace, run the fused GEMM, then the deterministic finishing kernel.
#include "ops/linear_rowscale_lse/kernels.hpp"

#include "common/error.hpp"
#include "kernels/kernels.hpp"
#include "ops/op_config.hpp"

#include <cstdint>

namespace coda::ops {

void linear_rowscale_lse(int64_t M, int64_t V, int64_t K, void const* h, int64_t ldh, void const* w, int64_t ldw,
                         float const* rstd, void const* targets, bool targets_int64, float softcap,
                         int64_t ignore_index, float* lse, float* target_logit, void* logits, int64_t ld_logits,
                         void* workspace, size_t workspace_bytes, bool fp16, cudaStream_t stream,
                         float* logit_sum) {
  namespace kn = lse_kernels;
  bool const store_logits = logits != nullptr;
  auto choice = store_logits ? choose_kernel("coda_linear_rowscale_lse", fp16, kn::fwd_bf16_coop_128x256x64_c2x1(),
                                             kn::fwd_bf16_pp_128x128x64_c2x1(), kn::fwd_fp16_pp_128x128x64_c2x1())
                             : choose_kernel("coda_linear_rowscale_lse", fp16,
                                             kn::fwd_bf16_nologits_coop_128x256x64_c2x1(),
                                             kn::fwd_bf16_nologits_pp_128x128x64_c2x1(),
                                             kn::fwd_fp16_nologits_pp_128x128x64_c2x1());
  // Default without stored logits (the LM head's loss path): pingpong (the exp-per-element epilogue overlaps the
  // other warpgroup's MMA), raster along N, swizzle 8; at K >= 8192 (llama3-70B, bf16) the cooperative 128x256,
  // same knobs. Measured under sustained load (bench/python/sweep_ops.py: back-to-back calls at the 700 W limit,
  // M = 8192, V = 128256; bench/results/sweep_ops_h200/): pingpong n/8 1.007 x cuBLAS at 1B and 1.062 x at
  // 8B, cooperative n/8 1.045 x at 70B, where raster N without swizzle (the best of bench_fused's one-after-another
  // sweep, and still the default with stored logits, which was not measured this way) took 1.125 / 1.189 /
  // 1.187 x, at 1155 MHz against 1395-1425 MHz. The likely reason (from the tile order, not profiled): without
  // swizzle a wave of tiles spans one 128-row band and hundreds of vocabulary columns, so the weight streams from
  // DRAM once per row band.
  if (!choice.pinned) {
    if (store_logits) {
      choice.knobs = raster_n(1);
    } else {
      if (K >= 8192 && !fp16) choice.ops = &kn::fwd_bf16_nologits_coop_128x256x64_c2x1();
      choice.knobs = raster_n(8);
    }
  }
  gemm::Knobs const& knobs = choice.knobs;
  gemm::KernelOps<LseArgs> const& k = *choice.ops;
  if (k.info.tile_m < kLseTileM || k.info.tile_n < kLseTileN) {
    coda::detail::fail(CODA_ERROR_INTERNAL, "coda_linear_rowscale_lse: kernel ", k.info.config,
                       " has a CTA tile that coda_linear_rowscale_lse_workspace_size does not cover");
  }

  LseWorkspace const ws = lse_workspace(M, V, k.info.tile_m, k.info.tile_n);
  if (workspace_bytes < ws.bytes() || workspace == nullptr || (reinterpret_cast<uintptr_t>(workspace) & 15u) != 0) {
    coda::detail::fail(CODA_ERROR_WORKSPACE, "coda_linear_rowscale_lse: kernel ", k.info.config, " needs ",
                       ws.bytes(), " bytes of 16-byte aligned workspace for the partials, got ", workspace_bytes);
  }

  gemm::Operands op;
  op.M = M, op.N = V, op.K = K;
  op.A = h, op.lda = ldh;
  op.B = w, op.ldb = ldw;
  op.D = logits, op.ldd = ld_logits;
  LseArgs args;
  args.rstd = rstd;
  args.softcap = softcap;
  args.targets = targets;
  args.targets_int64 = targets_int64;
  args.part_max = ws.buffer(workspace, 0);
  args.part_sumexp = ws.buffer(workspace, 1);
  args.part_sum = ws.buffer(workspace, 2);
  args.part_target = ws.buffer(workspace, 3);
  // No CUTLASS workspace: the epilogues reduce into the caller's buffers; run() rejects a kernel that would
  // need one (CODA_ERROR_WORKSPACE), so no separate workspace_size() query (a second argument build per call).
  k.run(op, args, knobs, nullptr, 0, stream);

  kernels::LseFinishArgs f;
  f.M = M;
  f.V = V;
  f.tiles = ws.tiles;
  f.ld = ws.m_pad;
  f.tile_n = k.info.tile_n;
  f.part_max = args.part_max;
  f.part_sumexp = args.part_sumexp;
  f.part_sum = logit_sum != nullptr ? args.part_sum : nullptr;  // read only for label smoothing
  f.part_target = args.part_target;
  f.targets = targets;
  f.targets_int64 = targets_int64;
  f.ignore_index = ignore_index;
  f.lse = lse;
  f.target_logit = target_logit;
  f.logit_sum = logit_sum;
  kernels::lse_finish(f, stream);
}

}  // namespace coda::ops
