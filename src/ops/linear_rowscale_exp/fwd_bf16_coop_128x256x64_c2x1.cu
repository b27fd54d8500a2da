// The exponential-form LM-head logits kernel over whole 256-column tiles (no column mask), without softcap: forward
// layout, bf16, config coop_128x256x64_c2x1 (one instantiation per file). Cooperative, not pingpong: the pingpong
// 128x128 kernel spilled 4 bytes with the target capture (its 128 accumulators leave 40 registers), the cooperative
// tile gives each thread two rows instead of four.
#include "ops/linear_rowscale_exp/epilogue.hpp"

namespace coda::ops::exp_ce_kernels {

gemm::KernelOps<ExpCeArgs> const& fwd_bf16_coop_128x256x64_c2x1() {
  return ExpCeKernel<gemm::config::Coop128x256x64C2x1, false, epilogue::SoftcapMode::kOff>::ops();
}

}  // namespace coda::ops::exp_ce_kernels
