// F3 dispatch (host only, no CUTLASS): pick a compiled config, build Operands, launch one GEMM.
#include "ops/linear_rowscale_swiglu/instances.hpp"

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
