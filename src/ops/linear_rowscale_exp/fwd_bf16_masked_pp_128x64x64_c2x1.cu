// The exponential-form LM-head logits kernel for the vocabulary's last columns (column mask; softcap chosen per
// call): forward layout, bf16, config pp_128x64x64_c2x1 (one instantiation per file).
#include "ops/linear_rowscale_exp/epilogue.hpp"

namespace coda::ops::exp_ce_kernels {

gemm::KernelOps<ExpCeArgs> const& fwd_bf16_masked_pp_128x64x64_c2x1() {
  return ExpCeKernel<gemm::config::Pp128x64x64C2x1, true, epilogue::SoftcapMode::kRunTime>::ops();
}

}  // namespace coda::ops::exp_ce_kernels
