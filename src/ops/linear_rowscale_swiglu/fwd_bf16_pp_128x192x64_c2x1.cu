// F3 linear_rowscale_swiglu kernel: forward layout, bf16 in/out, config pp_128x192x64_c2x1 (one instantiation per file).
#include "ops/linear_rowscale_swiglu/epilogue.hpp"

namespace coda::ops::swiglu_kernels {

gemm::KernelOps<SwigluArgs> const& fwd_bf16_pp_128x192x64_c2x1() { return SwigluKernel<gemm::config::Pp128x192x64C2x1>::ops(); }

}  // namespace coda::ops::swiglu_kernels
