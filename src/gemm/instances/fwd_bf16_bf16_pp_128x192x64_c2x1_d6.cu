// Plain GEMM kernel fwd_bf16_bf16_pp_128x192x64_c2x1_d6:
// layout fwd, bf16 in, bf16 out, config pp_128x192x64_c2x1 with the overwrite-only epilogue (6 D store buffers).
#include "gemm/instances/plain_instance.hpp"

namespace coda::gemm::plain {

Ops const& fwd_bf16_bf16_pp_128x192x64_c2x1_d6() {
  return PlainStoreGemm<config::Pp128x192x64C2x1D6, FwdLayout, cutlass::bfloat16_t, 6>::ops();
}

}  // namespace coda::gemm::plain
