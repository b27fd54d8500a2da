// B3 linear_swiglu_bwd_zdz kernel: dgrad layout (A = dx K-major, B = w_down N-major), bf16, config
// pp_128x192x64_c2x1_e16 (one instantiation per file).
#include "ops/linear_swiglu_bwd_zdz/epilogue.hpp"

namespace coda::ops::swiglu_bwd_kernels {

gemm::KernelOps<SwigluBwdArgs> const& dgrad_bf16_pp_128x192x64_c2x1_e16() {
  return SwigluBwdKernel<gemm::config::Pp128x192x64C2x1E16, cutlass::bfloat16_t>::ops();
}

}  // namespace coda::ops::swiglu_bwd_kernels
