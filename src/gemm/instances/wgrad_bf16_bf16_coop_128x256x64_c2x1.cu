// Plain GEMM kernel wgrad_bf16_bf16_coop_128x256x64_c2x1:
// layout wgrad, bf16 in, bf16 out, config coop_128x256x64_c2x1. One instantiation per file (docs/GEMM.md).
#include "gemm/instances/plain_instance.hpp"

namespace coda::gemm::plain {

Ops const& wgrad_bf16_bf16_coop_128x256x64_c2x1() {
  return PlainGemm<config::Coop128x256x64C2x1, WgradLayout, cutlass::bfloat16_t>::ops();
}

}  // namespace coda::gemm::plain
