// F3 linear_rowscale_swiglu kernel: forward layout, bf16 in/out, config pp_64x256x64_c2x1 (one instantiation per
// file). On trial, reached only by a per-op CODA_OP_CONFIG pin: one m64n256 wgmma per k-step reads 17 % fewer shared
// memory bytes per FLOP than the 128x128 tile's two m64n128 (computed), while pingpong keeps the epilogue behind
// the other warpgroup's MMA.
#include "ops/linear_rowscale_swiglu/epilogue.hpp"

namespace coda::ops::swiglu_kernels {

gemm::KernelOps<SwigluArgs> const& fwd_bf16_pp_64x256x64_c2x1() { return SwigluKernel<gemm::config::Pp64x256x64C2x1>::ops(); }

}  // namespace coda::ops::swiglu_kernels
