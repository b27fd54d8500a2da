// Plain GEMM kernel wgrad_bf16_fp32_coop_128x256x64_c2x1_radd:
// layout wgrad, bf16 in, fp32 out added into D by TMA reduce-add (beta = 1 only), config coop_128x256x64_c2x1;
// 2 D store buffers (4 would leave the mainloop 3 stages; 2 leave it 4, like the other 128x256 kernels).
#include "gemm/instances/plain_instance.hpp"

namespace coda::gemm::plain {

Ops const& wgrad_bf16_fp32_coop_128x256x64_c2x1_radd() {
  return PlainReduceAddGemm<config::Coop128x256x64C2x1Radd, WgradLayout, 2>::ops();
}

}  // namespace coda::gemm::plain
