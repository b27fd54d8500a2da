// F2 linear_rowscale kernel: forward layout, bf16 in/out, config coop_128x256x64_c2x1 (one instantiation per file).
#include "ops/linear_rowscale/epilogue.hpp"

namespace coda::ops::rowscale_kernels {

gemm::KernelOps<RowscaleArgs> const& fwd_bf16_coop_128x256x64_c2x1() {
  return RowscaleKernel<gemm::config::Coop128x256x64C2x1>::ops();
}

}  // namespace coda::ops::rowscale_kernels
