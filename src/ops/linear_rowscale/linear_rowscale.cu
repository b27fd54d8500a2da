// linear_rowscale (host only, no CUTLASS): the C ABI entry point (validation), and the dispatch: pick a compiled
// config, build Operands, launch.
#include "ops/linear_rowscale/instances.hpp"

#include <coda/coda.h>
#include <cuda_runtime_api.h>

#include "api/checks.hpp"
#include "api/guard.hpp"
#include "common/error.hpp"
#include "ops/op_config.hpp"

namespace coda::ops {

void linear_rowscale(int64_t M, int64_t N, int64_t K, void const* h, int64_t ldh, void const* w, int64_t ldw,
                     float const* rstd, void* y, int64_t ldy, bool fp16, cudaStream_t stream) {
  namespace kn = rowscale_kernels;
  auto const choice = kn::choose(fp16, M, N, K);  // op.cmake: the tile policy
  gemm::Knobs const& knobs = choice.knobs;
  gemm::KernelOps<RowscaleArgs> const& k = *choice.ops;
  gemm::Operands op;
  op.M = M, op.N = N, op.K = K;
  op.A = h, op.lda = ldh;
  op.B = w, op.ldb = ldw;
  op.D = y, op.ldd = ldy;
  RowscaleArgs args;
  args.rstd = rstd;
  // No CUTLASS workspace: the epilogues reduce into the caller's buffers; run() rejects a kernel that would
  // need one (CODA_ERROR_WORKSPACE), so no separate workspace_size() query (a second argument build per call).
  k.run(op, args, knobs, nullptr, 0, stream);
}

}  // namespace coda::ops

// The C ABI entry point (coda.h): every argument validated, then the dispatch above.
namespace api = coda::api;
using coda::api::Arg;
using coda::api::guarded;
using coda::api::row_stride;

extern "C" {

CODA_API size_t coda_linear_rowscale_workspace_size(int64_t M, int64_t N) { return 0; }

CODA_API coda_status coda_linear_rowscale(const coda_tensor* h, const coda_tensor* w, const coda_tensor* rstd,
                                          coda_tensor* y_out, void* workspace, size_t workspace_bytes,
                                          void* stream) {
  return guarded("coda_linear_rowscale", [&] {
    Arg const Hh{h, "h"}, W{w, "w"}, S{rstd, "rstd"}, Y{y_out, "y_out"};
    api::LinearShape const s = api::check_rowscale_inputs(Hh, W, S);
    api::check_activation(Y, Hh, s.M, s.N, "M", "N");
    api::check_disjoint({Y}, {Hh, W, S});
    api::require_workspace("coda_linear_rowscale", workspace, workspace_bytes,
                           coda_linear_rowscale_workspace_size(s.M, s.N));
    bool const fp16 = Hh.dtype() == CODA_FP16;
    api::require_fused_launch({Hh, W, S, Y});
    if (s.M == 0) return;
    coda::ops::linear_rowscale(s.M, s.N, s.K, h->data, row_stride(Hh, s.K), w->data, row_stride(W, s.K),
                               static_cast<float const*>(rstd->data), y_out->data, row_stride(Y, s.N), fp16,
                               static_cast<cudaStream_t>(stream));
  });
}

}  // extern "C"
