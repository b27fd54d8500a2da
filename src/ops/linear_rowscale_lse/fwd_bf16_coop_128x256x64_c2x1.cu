// F5 linear_rowscale_lse kernel that also stores the raw logits: forward layout, bf16 in/out, config
// coop_128x256x64_c2x1 (one instantiation per file).
#include "ops/linear_rowscale_lse/epilogue.hpp"

namespace coda::ops::lse_kernels {

gemm::KernelOps<LseArgs> const& fwd_bf16_coop_128x256x64_c2x1() {
  return LseKernel<gemm::config::Coop128x256x64C2x1>::ops();
}

}  // namespace coda::ops::lse_kernels
