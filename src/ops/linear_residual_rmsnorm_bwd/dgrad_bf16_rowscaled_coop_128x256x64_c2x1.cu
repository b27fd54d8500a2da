// B2 linear_residual_rmsnorm_bwd kernel with the row scale v (the LM head's exponential form, epilogue.hpp): dgrad
// layout, bf16, config coop_128x256x64_c2x1 (one instantiation per file).
#include "ops/linear_residual_rmsnorm_bwd/epilogue.hpp"

namespace coda::ops::residual_rmsnorm_bwd_kernels {

gemm::KernelOps<ResidualRmsnormBwdArgs> const& dgrad_bf16_rowscaled_coop_128x256x64_c2x1() {
  return ResidualRmsnormBwdRowScaledKernel<gemm::config::Coop128x256x64C2x1>::ops();
}

}  // namespace coda::ops::residual_rmsnorm_bwd_kernels
