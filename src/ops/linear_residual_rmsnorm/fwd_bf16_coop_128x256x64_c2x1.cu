// F1 linear_residual_rmsnorm kernel: forward layout, bf16 in/out, config coop_128x256x64_c2x1 (one instantiation
// per file).
#include "ops/linear_residual_rmsnorm/epilogue.hpp"

namespace coda::ops::residual_rmsnorm_kernels {

gemm::KernelOps<ResidualRmsnormArgs> const& fwd_bf16_coop_128x256x64_c2x1() {
  return ResidualRmsnormKernel<gemm::config::Coop128x256x64C2x1>::ops();
}

}  // namespace coda::ops::residual_rmsnorm_kernels
