// B3 linear_swiglu_bwd_zdz kernel: dgrad layout (A = dx K-major, B = w_down N-major), bf16, config
// coop_128x256x64_c2x1 (one instantiation per file).
#include "ops/linear_swiglu_bwd_zdz/epilogue.hpp"

namespace coda::ops::swiglu_bwd_kernels {

gemm::KernelOps<SwigluBwdArgs> const& dgrad_bf16_coop_128x256x64_c2x1() {
  return SwigluBwdKernel<gemm::config::Coop128x256x64C2x1, cutlass::bfloat16_t>::ops();
}

}  // namespace coda::ops::swiglu_bwd_kernels
