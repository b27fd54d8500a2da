// B2 linear_residual_rmsnorm_bwd kernel: dgrad layout (A = dz K-major, B = w N-major), fp16, config
// pp_128x128x64_c2x1 (one instantiation per file).
#include "ops/linear_residual_rmsnorm_bwd/epilogue.hpp"

namespace coda::ops::residual_rmsnorm_bwd_kernels {

gemm::KernelOps<ResidualRmsnormBwdArgs> const& dgrad_fp16_pp_128x128x64_c2x1() {
  return ResidualRmsnormBwdKernel<gemm::config::Pp128x128x64C2x1, cutlass::half_t>::ops();
}

}  // namespace coda::ops::residual_rmsnorm_bwd_kernels
