// F2 dispatch (host only, no CUTLASS): pick a compiled config, build Operands, launch.
#include "ops/linear_rowscale/instances.hpp"

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
