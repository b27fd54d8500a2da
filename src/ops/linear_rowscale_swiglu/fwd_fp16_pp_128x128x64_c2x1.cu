// F3 linear_rowscale_swiglu kernel: forward layout, fp16 in/out, config pp_128x128x64_c2x1 (one instantiation per
// file).
#include "ops/linear_rowscale_swiglu/epilogue.hpp"

namespace coda::ops::swiglu_kernels {

gemm::KernelOps<SwigluArgs> const& fwd_fp16_pp_128x128x64_c2x1() {
  return SwigluKernel<gemm::config::Pp128x128x64C2x1, cutlass::half_t>::ops();
}

}  // namespace coda::ops::swiglu_kernels
