// F2 linear_rowscale kernel: forward layout, fp16 in/out, config pp_128x128x64_c2x1 (one instantiation per file).
#include "ops/linear_rowscale/epilogue.hpp"

namespace coda::ops::rowscale_kernels {

gemm::KernelOps<RowscaleArgs> const& fwd_fp16_pp_128x128x64_c2x1() {
  return RowscaleKernel<gemm::config::Pp128x128x64C2x1, cutlass::half_t>::ops();
}

}  // namespace coda::ops::rowscale_kernels
