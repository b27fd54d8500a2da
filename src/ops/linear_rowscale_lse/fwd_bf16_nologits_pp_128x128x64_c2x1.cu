// F5 linear_rowscale_lse kernel without logits (D = void, partials only): forward layout, bf16 in, config pp_128x128x64_c2x1 (one
// instantiation per file).
#include "ops/linear_rowscale_lse/epilogue.hpp"

namespace coda::ops::lse_kernels {

gemm::KernelOps<LseArgs> const& fwd_bf16_nologits_pp_128x128x64_c2x1() {
  return LseNoLogitsKernel<gemm::config::Pp128x128x64C2x1>::ops();
}

}  // namespace coda::ops::lse_kernels
