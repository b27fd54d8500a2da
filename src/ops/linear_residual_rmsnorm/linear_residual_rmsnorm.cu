// F1 dispatch (host only, no CUTLASS): pick a compiled config, run the fused GEMM (x, h, partials), then the
// deterministic rstd finishing kernel over the partials.
#include "ops/linear_residual_rmsnorm/instances.hpp"

#include "common/error.hpp"
#include "kernels/kernels.hpp"
#include "ops/op_config.hpp"

#include <cstdint>

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
