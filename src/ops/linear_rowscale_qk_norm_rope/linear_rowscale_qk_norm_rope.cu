// F4 with QK-norm dispatch (host only, no CUTLASS): pick the compiled config, launch one GEMM.
#include "ops/linear_rowscale_qk_norm_rope/instances.hpp"

#include "ops/op_config.hpp"

namespace coda::ops {

void linear_rowscale_qk_norm_rope(int64_t M, int64_t N, int64_t K, void const* h, int64_t ldh, void const* w_qkv,
                                  int64_t ldw, QkNormRopeArgs const& args, void* qkv, int64_t ldq, bool fp16,
                                  cudaStream_t stream) {
  auto const choice = qk_norm_rope_kernels::choose(fp16, M, N, K);  // op.cmake: the tile policy
  gemm::Operands op;
  op.M = M, op.N = N, op.K = K;
  op.A = h, op.lda = ldh;
  op.B = w_qkv, op.ldb = ldw;
  op.D = qkv, op.ldd = ldq;
  choice.ops->run(op, args, choice.knobs, nullptr, 0, stream);
}

}  // namespace coda::ops
