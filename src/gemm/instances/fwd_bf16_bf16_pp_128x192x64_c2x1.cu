// Plain GEMM kernel fwd_bf16_bf16_pp_128x192x64_c2x1:
// layout fwd, bf16 in, bf16 out, config pp_128x192x64_c2x1. One instantiation per file (docs/GEMM.md).
#include "gemm/instances/plain_instance.hpp"

namespace coda::gemm::plain {

Ops const& fwd_bf16_bf16_pp_128x192x64_c2x1() {
  return PlainGemm<config::Pp128x192x64C2x1, FwdLayout, cutlass::bfloat16_t>::ops();
}

}  // namespace coda::gemm::plain
