// F1 linear_residual_rmsnorm kernel: forward layout, fp16 in/out, config pp_128x128x64_c2x1 (one instantiation per
// file).
#include "ops/linear_residual_rmsnorm/epilogue.hpp"

namespace coda::ops::residual_rmsnorm_kernels {

gemm::KernelOps<ResidualRmsnormArgs> const& fwd_fp16_pp_128x128x64_c2x1() {
  return ResidualRmsnormKernel<gemm::config::Pp128x128x64C2x1, cutlass::half_t>::ops();
}

}  // namespace coda::ops::residual_rmsnorm_kernels
