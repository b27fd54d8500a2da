// Plain GEMM kernel wgrad_bf16_fp32_pp_128x128x64_c2x1_radd:
// layout wgrad, bf16 in, fp32 out added into D by TMA reduce-add (beta = 1 only), config pp_128x128x64_c2x1.
#include "gemm/instances/plain_instance.hpp"

namespace coda::gemm::plain {

Ops const& wgrad_bf16_fp32_pp_128x128x64_c2x1_radd() {
  return PlainReduceAddGemm<config::Pp128x128x64C2x1Radd, WgradLayout, 4>::ops();
}

}  // namespace coda::gemm::plain
