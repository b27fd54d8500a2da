// F1 linear_residual_rmsnorm kernel: forward layout, bf16 in/out, config pp_64x256x64_c2x1 (one instantiation
// per file). On trial, reached only by a per-op CODA_OP_CONFIG pin (see the F3 kernel of the same config).
#include "ops/linear_residual_rmsnorm/epilogue.hpp"

namespace coda::ops::residual_rmsnorm_kernels {

gemm::KernelOps<ResidualRmsnormArgs> const& fwd_bf16_pp_64x256x64_c2x1() {
  return ResidualRmsnormKernel<gemm::config::Pp64x256x64C2x1>::ops();
}

}  // namespace coda::ops::residual_rmsnorm_kernels
