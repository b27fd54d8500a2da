// B2 dispatch (host only, no CUTLASS): the fused dgrad GEMM (dx, a, dgamma column partials), then the dgamma
// finishing reduce. bf16: pingpong 128x128 and cooperative 128x256 (the default at K >= 8192); fp16: pingpong.
#include "ops/linear_residual_rmsnorm_bwd/instances.hpp"

#include "common/error.hpp"
#include "kernels/kernels.hpp"
#include "ops/op_config.hpp"

#include <cstdint>

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
