// F4 linear_rowscale_rope kernel: forward layout, bf16 in/out, config coop_128x256x64_c2x1 (one instantiation per file).
#include "ops/linear_rowscale_rope/epilogue.hpp"

namespace coda::ops::rope_kernels {

gemm::KernelOps<RopeArgs> const& fwd_bf16_coop_128x256x64_c2x1() { return RopeKernel<gemm::config::Coop128x256x64C2x1>::ops(); }

}  // namespace coda::ops::rope_kernels
