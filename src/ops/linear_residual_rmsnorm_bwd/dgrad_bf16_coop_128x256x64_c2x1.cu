// B2 linear_residual_rmsnorm_bwd kernel: dgrad layout (A = dz K-major, B = w N-major), bf16, config
// coop_128x256x64_c2x1 with 3 C/x epilogue stages (epilogue.hpp), so the mainloop keeps 3 (one instantiation per
// file).
#include "ops/linear_residual_rmsnorm_bwd/epilogue.hpp"

namespace coda::ops::residual_rmsnorm_bwd_kernels {

gemm::KernelOps<ResidualRmsnormBwdArgs> const& dgrad_bf16_coop_128x256x64_c2x1() {
  return ResidualRmsnormBwdKernel<gemm::config::Coop128x256x64C2x1>::ops();
}

}  // namespace coda::ops::residual_rmsnorm_bwd_kernels
