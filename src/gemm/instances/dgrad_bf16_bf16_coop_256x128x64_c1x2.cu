// Plain GEMM kernel dgrad_bf16_bf16_coop_256x128x64_c1x2:
// layout dgrad, bf16 in, bf16 out, config coop_256x128x64_c1x2. One instantiation per file (docs/GEMM.md).
#include "gemm/instances/plain_instance.hpp"

namespace coda::gemm::plain {

Ops const& dgrad_bf16_bf16_coop_256x128x64_c1x2() {
  return PlainGemm<config::Coop256x128x64C1x2, DgradLayout, cutlass::bfloat16_t>::ops();
}

}  // namespace coda::gemm::plain
