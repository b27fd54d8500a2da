// F3 linear_rowscale_swiglu kernel: forward layout, bf16 in/out, config coop_128x256x64_c2x1 (one instantiation per file).
#include "ops/linear_rowscale_swiglu/epilogue.hpp"

namespace coda::ops::swiglu_kernels {

gemm::KernelOps<SwigluArgs> const& fwd_bf16_coop_128x256x64_c2x1() { return SwigluKernel<gemm::config::Coop128x256x64C2x1>::ops(); }

}  // namespace coda::ops::swiglu_kernels
