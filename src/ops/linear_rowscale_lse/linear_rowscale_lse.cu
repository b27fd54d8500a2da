// F5 dispatch (host only, no CUTLASS): pick the kernel (with or without stored logits), carve the partials out of
// the caller's workspace, run the fused GEMM, then the deterministic finishing kernel.
#include "ops/linear_rowscale_lse/instances.hpp"

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
  // op.cmake: the tile policy of each twin
  auto const choice = store_logits ? kn::choose(fp16, M, V, K) : kn::choose_nologits(fp16, M, V, K);
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
