// linear_residual_rmsnorm_bwd (host only, no CUTLASS): the C ABI entry point (validation), and the dispatch: the
// fused dgrad GEMM (dx, a, dgamma column partials), then the dgamma finishing reduce.
#include "ops/linear_residual_rmsnorm_bwd/instances.hpp"

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

void linear_residual_rmsnorm_bwd(int64_t M, int64_t N, int64_t Nd, void const* dz, int64_t ldz, void const* w,
                                 int64_t ldw, void const* x, int64_t ldx, void const* gamma, float const* rstd,
                                 float const* zdz, void const* dx_in, int64_t ld_dx_in, float alpha, void* dx,
                                 int64_t ld_dx, void* a, int64_t ld_a, float* dgamma, bool fp16, void* workspace,
                                 size_t workspace_bytes, cudaStream_t stream, float const* row_scale) {
  namespace kn = residual_rmsnorm_bwd_kernels;
  // op.cmake: the tile policy, the same for the row-scaled twins (bf16 only: api/lm_head_bwd_ops.cpp takes the
  // row-scaled path for bf16 alone; fp16 there would be CODA_ERROR_INTERNAL)
  auto const choice = row_scale != nullptr ? kn::choose_rowscaled(fp16, M, N, Nd) : kn::choose(fp16, M, N, Nd);
  gemm::KernelOps<ResidualRmsnormBwdArgs> const& k = *choice.ops;
  gemm::Knobs const& knobs = choice.knobs;

  // Workspace: column partials [ceil(M / CTA_M), round_up(N, CTA_N)] fp32, n-major (the ColumnPartials node of
  // acc * c; column_sum applies alpha to the finished sums).
  int64_t const tiles = (M + k.info.tile_m - 1) / k.info.tile_m;
  int64_t const n_pad = (N + k.info.tile_n - 1) / k.info.tile_n * k.info.tile_n;
  size_t const need_partials = static_cast<size_t>(tiles * n_pad) * sizeof(float);
  if (workspace_bytes < need_partials || workspace == nullptr ||
      (reinterpret_cast<uintptr_t>(workspace) & 15u) != 0) {
    coda::detail::fail(CODA_ERROR_WORKSPACE, "coda_linear_residual_rmsnorm_bwd: kernel ", k.info.config, " needs ",
                       need_partials, " bytes of 16-byte aligned workspace for the dgamma partials, got ",
                       workspace_bytes);
  }
  // Without dx_in the epilogue still reads C: give it dx itself, zero-filled (dx = 0 + ...).
  void const* c = dx_in;
  int64_t ldc = ld_dx_in;
  if (c == nullptr) {
    CODA_CUDA_CHECK(cudaMemset2DAsync(dx, static_cast<size_t>(ld_dx) * 2, 0, static_cast<size_t>(N) * 2,  // 16-bit
                                      static_cast<size_t>(M), stream));
    c = dx;
    ldc = ld_dx;
  }

  gemm::Operands op;
  op.M = M, op.N = N, op.K = Nd;
  op.A = dz, op.lda = ldz;
  op.B = w, op.ldb = ldw;
  op.C = c, op.ldc = ldc;
  op.D = dx, op.ldd = ld_dx;
  ResidualRmsnormBwdArgs args;
  args.alpha = alpha;
  args.x = x;
  args.ldx = ldx;
  args.gamma = gamma;
  args.rstd = rstd;
  args.zdz = zdz;
  args.a = a;
  args.lda = ld_a;
  args.dgamma_partials = static_cast<float*>(workspace);
  args.row_scale = row_scale;
  // No CUTLASS workspace: the epilogues reduce into the caller's buffers; run() rejects a kernel that would
  // need one (CODA_ERROR_WORKSPACE), so no separate workspace_size() query (a second argument build per call).
  k.run(op, args, knobs, nullptr, 0, stream);
  kernels::column_sum(args.dgamma_partials, tiles, n_pad, N, dgamma, stream, alpha);
}

}  // namespace coda::ops

// The C ABI entry point (coda.h): every argument validated, then the dispatch above.
namespace api = coda::api;
using coda::api::Arg;
using coda::api::guarded;
using coda::api::row_stride;
using coda::detail::fail;

extern "C" {

CODA_API size_t coda_linear_residual_rmsnorm_bwd_workspace_size(int64_t M, int64_t N) {
  // Column partials (an upper bound over the CTA tiles); alpha is applied in the epilogue and the finishing sum.
  return M <= 0 ? 0 : api::col_partials_bytes(M, N);
}

CODA_API coda_status coda_linear_residual_rmsnorm_bwd(const coda_tensor* dz, const coda_tensor* w,
                                                      const coda_tensor* x, const coda_tensor* gamma,
                                                      const coda_tensor* rstd, const coda_tensor* zdz,
                                                      const coda_tensor* dx_in, float alpha, coda_tensor* dx_out,
                                                      coda_tensor* a_out, coda_tensor* dgamma_out, void* workspace,
                                                      size_t workspace_bytes, void* stream) {
  return guarded("coda_linear_residual_rmsnorm_bwd", [&] {
    Arg const DZ{dz, "dz"}, W{w, "w"}, X{x, "x"}, G{gamma, "gamma"}, S{rstd, "rstd"}, ZD{zdz, "zdz"};
    Arg const DXI{dx_in, "dx_in"}, DX{dx_out, "dx_out"}, A{a_out, "a_out"}, DG{dgamma_out, "dgamma_out"};
    api::LinearShape const s = api::check_dgrad(DZ, W);
    api::check_activation(X, DZ, s.M, s.N, "M", "N = w.sizes[1]");
    api::check_vector(G, s.N, {DZ.dtype()}, "N", "w.sizes[1]");
    api::check_vector(S, s.M, {CODA_FP32}, "M", "dz.sizes[0]");
    api::check_vector(ZD, s.M, {CODA_FP32}, "M", "dz.sizes[0]");
    if (dx_in != nullptr) api::check_activation(DXI, DZ, s.M, s.N, "M", "N");
    if (!std::isfinite(alpha)) fail(CODA_ERROR_INVALID_ARGUMENT, "alpha: must be finite, got ", alpha);
    api::check_activation(DX, DZ, s.M, s.N, "M", "N");
    api::check_activation(A, DZ, s.M, s.N, "M", "N");
    api::check_vector(DG, s.N, {CODA_FP32}, "N", "w.sizes[1]");
    api::require_same_or_disjoint(DX, DXI);  // residual gradient accumulated in place
    api::check_disjoint({DX}, {DZ, W, X, G, S, ZD});
    api::check_disjoint({A, DG}, {DZ, W, X, G, S, ZD, DXI, DX});
    api::require_workspace("coda_linear_residual_rmsnorm_bwd", workspace, workspace_bytes,
                           coda_linear_residual_rmsnorm_bwd_workspace_size(s.M, s.N));
    api::require_fused_launch({DZ, W, X, G, S, ZD, DXI, DX, A, DG});
    if (s.M == 0) {  // nothing to launch but dgamma = 0 (an empty sum)
      CODA_CUDA_CHECK(cudaMemsetAsync(dgamma_out->data, 0, static_cast<size_t>(s.N) * sizeof(float),
                                      static_cast<cudaStream_t>(stream)));
      return;
    }
    coda::ops::linear_residual_rmsnorm_bwd(
        s.M, s.N, s.K, dz->data, row_stride(DZ, s.K), w->data, row_stride(W, s.N), x->data, row_stride(X, s.N),
        gamma->data, static_cast<float const*>(rstd->data), static_cast<float const*>(zdz->data),
        dx_in != nullptr ? dx_in->data : nullptr, dx_in != nullptr ? row_stride(DXI, s.N) : 0, alpha, dx_out->data,
        row_stride(DX, s.N), a_out->data, row_stride(A, s.N), static_cast<float*>(dgamma_out->data),
        DZ.dtype() == CODA_FP16, workspace, workspace_bytes, static_cast<cudaStream_t>(stream));
  });
}

}  // extern "C"
