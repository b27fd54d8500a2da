// F5 linear_rowscale_lse kernel that stores the raw logits: forward layout, fp16 in/out, config pp_128x128x64_c2x1
// (one instantiation per file).
#include "ops/linear_rowscale_lse/epilogue.hpp"

namespace coda::ops::lse_kernels {

gemm::KernelOps<LseArgs> const& fwd_fp16_pp_128x128x64_c2x1() {
  return LseKernel<gemm::config::Pp128x128x64C2x1, cutlass::half_t>::ops();
}

}  // namespace coda::ops::lse_kernels
