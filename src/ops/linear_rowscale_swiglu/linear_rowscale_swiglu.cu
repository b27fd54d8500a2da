// linear_rowscale_swiglu (host only, no CUTLASS): the C ABI entry point (validation), and the dispatch: pick a
// compiled config, build Operands, launch one GEMM.
#include "ops/linear_rowscale_swiglu/instances.hpp"

#include <coda/coda.h>
#include <cuda_runtime_api.h>

#include "api/checks.hpp"
#include "api/guard.hpp"
#include "common/error.hpp"
#include "ops/op_config.hpp"

namespace coda::ops {

void linear_rowscale_swiglu(int64_t M, int64_t N, int64_t K, void const* h, int64_t ldh, void const* w_gu,
                            int64_t ldw, float const* rstd, void* z, int64_t ldz, void* y, int64_t ldy, bool fp16,
                            cudaStream_t stream) {
  namespace kn = swiglu_kernels;
  auto const choice = kn::choose(fp16, M, N, K);  // op.cmake: the tile policy
  gemm::Knobs const& knobs = choice.knobs;
  gemm::Operands op;
  op.M = M, op.N = N, op.K = K;
  op.A = h, op.lda = ldh;
  op.B = w_gu, op.ldb = ldw;
  op.D = z, op.ldd = ldz;
  SwigluArgs args;
  args.rstd = rstd;
  args.y = y;
  args.ldy = ldy;
  gemm::KernelOps<SwigluArgs> const& k = *choice.ops;
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
using coda::detail::fail;

extern "C" {

CODA_API size_t coda_linear_rowscale_swiglu_workspace_size(int64_t M, int64_t N) { return 0; }

CODA_API coda_status coda_linear_rowscale_swiglu(const coda_tensor* h, const coda_tensor* w_gu,
                                                 const coda_tensor* rstd, coda_tensor* z_out, coda_tensor* y_out,
                                                 void* workspace, size_t workspace_bytes, void* stream) {
  return guarded("coda_linear_rowscale_swiglu", [&] {
    Arg const Hh{h, "h"}, W{w_gu, "w_gu"}, S{rstd, "rstd"}, Z{z_out, "z_out"}, Y{y_out, "y_out"};
    api::LinearShape const s = api::check_rowscale_inputs(Hh, W, S);
    if (s.N % 16 != 0) {
      fail(CODA_ERROR_SHAPE, "w_gu: sizes[0] = 2F = ", s.N,
           " must be a multiple of 16 (interleaved gate/up pairs, and y = [M,F] needs F a multiple of 8)");
    }
    api::check_activation(Z, Hh, s.M, s.N, "M", "2F");
    api::check_activation(Y, Hh, s.M, s.N / 2, "M", "F");
    api::check_disjoint({Z, Y}, {Hh, W, S});
    api::require_workspace("coda_linear_rowscale_swiglu", workspace, workspace_bytes,
                           coda_linear_rowscale_swiglu_workspace_size(s.M, s.N));
    bool const fp16 = Hh.dtype() == CODA_FP16;
    api::require_fused_launch({Hh, W, S, Z, Y});
    if (s.M == 0) return;
    coda::ops::linear_rowscale_swiglu(s.M, s.N, s.K, h->data, row_stride(Hh, s.K), w_gu->data, row_stride(W, s.K),
                                      static_cast<float const*>(rstd->data), z_out->data, row_stride(Z, s.N),
                                      y_out->data, row_stride(Y, s.N / 2), fp16, static_cast<cudaStream_t>(stream));
  });
}

}  // extern "C"
