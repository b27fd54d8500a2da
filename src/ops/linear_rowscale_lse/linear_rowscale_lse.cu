// linear_rowscale_lse (host only, no CUTLASS): the C ABI entry point (validation), and the dispatch: pick the kernel
// (with or without stored logits), carve the partials out of the caller's workspace, run the fused GEMM, then the
// deterministic finishing kernel.
#include "ops/linear_rowscale_lse/instances.hpp"

#include <coda/coda.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "api/checks.hpp"
#include "api/guard.hpp"
#include "common/error.hpp"
#include "kernels/kernels.hpp"
#include "ops/op_config.hpp"

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

// The C ABI entry point (coda.h): every argument validated, then the dispatch above.
namespace api = coda::api;
using coda::api::Arg;
using coda::api::guarded;
using coda::api::row_stride;
using coda::detail::fail;

extern "C" {

CODA_API size_t coda_linear_rowscale_lse_workspace_size(int64_t M, int64_t V) {
  // Four fp32 [T, Mpad] partial buffers of the linear_rowscale_lse kernels' CTA tile (max, sum-exp, logit sum, target
  // logit), each 256-byte aligned: exactly ops::lse_workspace(M, V, kLseTileM, kLseTileN).bytes().
  return 4 * api::row_partials_bytes(M, V, coda::ops::kLseTileM, coda::ops::kLseTileN);
}

CODA_API coda_status coda_linear_rowscale_lse(const coda_tensor* h, const coda_tensor* w, const coda_tensor* rstd,
                                              const coda_tensor* targets, float softcap, int64_t ignore_index,
                                              coda_tensor* lse_out, coda_tensor* target_logit_out,
                                              coda_tensor* logits_out, void* workspace, size_t workspace_bytes,
                                              void* stream) {
  return guarded("coda_linear_rowscale_lse", [&] {
    Arg const Hh{h, "h"}, W{w, "w"}, S{rstd, "rstd"}, T{targets, "targets"};
    Arg const L{lse_out, "lse_out"}, TL{target_logit_out, "target_logit_out"}, LG{logits_out, "logits_out"};
    api::LinearShape const s = api::check_rowscale_inputs(Hh, W, S);
    api::check_vector(T, s.M, {CODA_INT32, CODA_INT64}, "M", "h.sizes[0]");
    if (!(softcap >= 0.0f) || !std::isfinite(softcap)) {
      fail(CODA_ERROR_INVALID_ARGUMENT, "softcap: must be finite and >= 0 (0 = off), got ", softcap);
    }
    api::check_vector(L, s.M, {CODA_FP32}, "M", "h.sizes[0]");
    api::check_vector(TL, s.M, {CODA_FP32}, "M", "h.sizes[0]");
    if (logits_out != nullptr) api::check_activation(LG, Hh, s.M, s.N, "M", "V");
    api::check_disjoint({L, TL, LG}, {Hh, W, S, T});
    api::require_workspace("coda_linear_rowscale_lse", workspace, workspace_bytes,
                           coda_linear_rowscale_lse_workspace_size(s.M, s.N));
    bool const fp16 = Hh.dtype() == CODA_FP16;
    api::require_fused_launch({Hh, W, S, T, L, TL, LG});
    if (s.M == 0) return;
    coda::ops::linear_rowscale_lse(s.M, s.N, s.K, h->data, row_stride(Hh, s.K), w->data, row_stride(W, s.K),
                                   static_cast<float const*>(rstd->data), targets->data, T.dtype() == CODA_INT64,
                                   softcap, ignore_index, static_cast<float*>(lse_out->data),
                                   static_cast<float*>(target_logit_out->data),
                                   logits_out != nullptr ? logits_out->data : nullptr,
                                   logits_out != nullptr ? row_stride(LG, s.N) : 0, workspace, workspace_bytes, fp16,
                                   static_cast<cudaStream_t>(stream));
  });
}

}  // extern "C"
