// The exponential-form LM-head logits kernel over whole 128-column tiles (no column mask), without softcap: forward
// layout, bf16, config pp_128x128x64_c2x1 (one instantiation per file).
#include "ops/linear_rowscale_exp/epilogue.hpp"

namespace coda::ops::exp_ce_kernels {

gemm::KernelOps<ExpCeArgs> const& fwd_bf16_pp_128x128x64_c2x1() {
  return ExpCeKernel<gemm::config::Pp128x128x64C2x1, false, epilogue::SoftcapMode::kOff>::ops();
}

}  // namespace coda::ops::exp_ce_kernels
