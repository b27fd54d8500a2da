// B2 linear_residual_rmsnorm_bwd kernel: dgrad layout (A = dz K-major, B = w N-major), bf16, config
// pp_128x128x64_c2x1, x through stage-0 vector loads (for very long K; one instantiation per file).
#include "ops/linear_residual_rmsnorm_bwd/epilogue.hpp"

namespace coda::ops::residual_rmsnorm_bwd_kernels {

gemm::KernelOps<ResidualRmsnormBwdArgs> const& dgrad_bf16_pp_128x128x64_c2x1_xvec() {
  return ResidualRmsnormBwdKernel<gemm::config::Pp128x128x64C2x1, cutlass::bfloat16_t, false>::ops();
}

}  // namespace coda::ops::residual_rmsnorm_bwd_kernels
