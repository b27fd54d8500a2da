// linear_residual_rmsnorm (host only, no CUTLASS): the C ABI entry point (validation), and the dispatch: pick a
// compiled config, run the fused GEMM (x, h, partials), then the deterministic rstd finishing kernel over the partials.
#include "ops/linear_residual_rmsnorm/instances.hpp"

#include <coda/coda.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "api/checks.hpp"
#include "api/guard.hpp"
#include "common/error.hpp"
#include "kernels/kernels.hpp"
#include "ops/op_config.hpp"

namespace coda::ops {

PartialsLayout partials_layout(gemm::KernelInfo const& info, int64_t M, int64_t N) {
  PartialsLayout p;
  p.tiles = (N + info.tile_n - 1) / info.tile_n;
  p.m_pad = (M + info.tile_m - 1) / info.tile_m * info.tile_m;
  return p;
}

void linear_residual_rmsnorm(int64_t M, int64_t N, int64_t K, void const* a, int64_t lda, void const* w,
                             int64_t ldw, void const* residual, int64_t ldr, void const* gamma, float eps, void* x,
                             int64_t ldx, void* h, int64_t ldh, float* rstd, void* workspace,
                             size_t workspace_bytes, bool fp16, cudaStream_t stream) {
  namespace kn = residual_rmsnorm_kernels;
  auto const choice = kn::choose(fp16, M, N, K);  // op.cmake: the tile policy
  gemm::Knobs const& knobs = choice.knobs;
  gemm::KernelOps<ResidualRmsnormArgs> const& k = *choice.ops;

  PartialsLayout const layout = partials_layout(k.info, M, N);
  if (workspace_bytes < layout.bytes() || workspace == nullptr ||
      (reinterpret_cast<uintptr_t>(workspace) & 15u) != 0) {
    coda::detail::fail(CODA_ERROR_WORKSPACE, "coda_linear_residual_rmsnorm: kernel ", k.info.config, " needs ",
                       layout.bytes(), " bytes of 16-byte aligned workspace for the partials, got ",
                       workspace_bytes);
  }
  gemm::Operands op;
  op.M = M, op.N = N, op.K = K;
  op.A = a, op.lda = lda;
  op.B = w, op.ldb = ldw;
  op.C = residual, op.ldc = ldr;
  op.D = x, op.ldd = ldx;
  ResidualRmsnormArgs args;
  args.gamma = gamma;
  args.h = h;
  args.ldh = ldh;
  args.partials = static_cast<float*>(workspace);
  // No CUTLASS workspace: the epilogues reduce into the caller's buffers; run() rejects a kernel that would
  // need one (CODA_ERROR_WORKSPACE), so no separate workspace_size() query (a second argument build per call).
  k.run(op, args, knobs, nullptr, 0, stream);
  kernels::rmsnorm_rstd(args.partials, layout.tiles, M, layout.m_pad, N, eps, rstd, stream);
}

}  // namespace coda::ops

// The C ABI entry point (coda.h): every argument validated, then the dispatch above.
namespace api = coda::api;
using coda::api::Arg;
using coda::api::guarded;
using coda::api::row_stride;

extern "C" {

CODA_API size_t coda_linear_residual_rmsnorm_workspace_size(int64_t M, int64_t N) {
  return api::row_partials_bytes(M, N);
}

CODA_API coda_status coda_linear_residual_rmsnorm(const coda_tensor* a, const coda_tensor* w,
                                                  const coda_tensor* residual, const coda_tensor* gamma, float eps,
                                                  coda_tensor* x_out, coda_tensor* h_out, coda_tensor* rstd_out,
                                                  void* workspace, size_t workspace_bytes, void* stream) {
  return guarded("coda_linear_residual_rmsnorm", [&] {
    Arg const A{a, "a"}, W{w, "w"}, R{residual, "residual"}, G{gamma, "gamma"};
    Arg const X{x_out, "x_out"}, H{h_out, "h_out"}, S{rstd_out, "rstd_out"};
    api::LinearShape const s = api::check_linear(A, W);
    api::check_activation(R, A, s.M, s.N, "M", "N");
    api::check_vector(G, s.N, {A.dtype()}, "N", "w.sizes[0]");
    api::check_eps(eps);
    api::check_activation(X, A, s.M, s.N, "M", "N");
    api::check_activation(H, A, s.M, s.N, "M", "N");
    api::check_vector(S, s.M, {CODA_FP32}, "M", "a.sizes[0]");
    api::require_same_or_disjoint(X, R);  // the residual stream may be updated in place
    api::check_disjoint({X}, {A, W, G});
    api::check_disjoint({H, S}, {A, W, R, G, X});
    api::require_workspace("coda_linear_residual_rmsnorm", workspace, workspace_bytes,
                           coda_linear_residual_rmsnorm_workspace_size(s.M, s.N));
    bool const fp16 = A.dtype() == CODA_FP16;
    api::require_fused_launch({A, W, R, G, X, H, S});
    if (s.M == 0) return;
    coda::ops::linear_residual_rmsnorm(s.M, s.N, s.K, a->data, row_stride(A, s.K), w->data, row_stride(W, s.K),
                                       residual->data, row_stride(R, s.N), gamma->data, eps, x_out->data,
                                       row_stride(X, s.N), h_out->data, row_stride(H, s.N),
                                       static_cast<float*>(rstd_out->data), workspace, workspace_bytes, fp16,
                                       static_cast<cudaStream_t>(stream));
  });
}

}  // extern "C"
