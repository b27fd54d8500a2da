// F4 linear_rowscale_rope kernel: forward layout, fp16 in/out, config pp_128x128x64_c2x1 (one instantiation per file).
#include "ops/linear_rowscale_rope/epilogue.hpp"

namespace coda::ops::rope_kernels {

gemm::KernelOps<RopeArgs> const& fwd_fp16_pp_128x128x64_c2x1() {
  return RopeKernel<gemm::config::Pp128x128x64C2x1, cutlass::half_t>::ops();
}

}  // namespace coda::ops::rope_kernels
