// The compiled kernels of the plain GEMM (CUTLASS-free declarations; one definition per src/gemm/instances/*.cu).
//
// Naming: <layout>_<in>_<out>_<config>.
//   layout fwd:   A K-major (row-major [M,K]),  B K-major (nn.Linear weight [N,K])     y = x W^T
//   layout dgrad: A K-major,                    B N-major (B(n,k) = W[k,n])            dx = dz W
//   layout wgrad: A M-major (A(m,k) = dz[k,m]), B N-major (B(n,k) = a[k,n])            dW = dz^T a
// Configs (src/gemm/configs.hpp): coop/pp = cooperative/pingpong warp-specialized, sk = cooperative with the
// stream-K scheduler, <tile M>x<tile N>x<tile K>, c<cluster M>x<cluster N>.
// docs/GEMM.md explains which combinations are instantiated and why; every other combination runs on cuBLAS.
#pragma once

#include "gemm/kernel_api.hpp"

namespace coda::gemm {

/// Arguments of the linear-combination epilogue: D = alpha * acc + beta * C (fp32 math, rounded once to D).
/// C is not read when beta == 0.
struct LinearCombinationArgs {
  float alpha = 1.0f;
  float beta = 0.0f;
};

namespace plain {

using Ops = KernelOps<LinearCombinationArgs>;

// fwd, bf16 -> bf16: the full config set.
Ops const& fwd_bf16_bf16_coop_128x256x64_c2x1();
Ops const& fwd_bf16_bf16_coop_128x256x64_c1x1();
Ops const& fwd_bf16_bf16_pp_128x128x64_c2x1();
Ops const& fwd_bf16_bf16_pp_64x256x64_c2x1();
Ops const& fwd_bf16_bf16_pp_128x192x64_c2x1();
Ops const& fwd_bf16_bf16_pp_128x192x64_c2x1_d6();  // overwrite only (beta = 0)
Ops const& fwd_bf16_bf16_coop_256x128x64_c1x2();
Ops const& fwd_bf16_bf16_sk_128x256x64_c2x1();
// dgrad, bf16 -> bf16.
Ops const& dgrad_bf16_bf16_sk_128x256x64_c2x1();
Ops const& dgrad_bf16_bf16_pp_128x128x64_c2x1();
Ops const& dgrad_bf16_bf16_coop_128x256x64_c2x1();
Ops const& dgrad_bf16_bf16_coop_256x128x64_c1x2();
// wgrad, bf16 -> bf16 and bf16 -> fp32 (fp32 master-gradient accumulation).
Ops const& wgrad_bf16_bf16_sk_128x256x64_c2x1();
Ops const& wgrad_bf16_bf16_pp_128x128x64_c2x1();
Ops const& wgrad_bf16_bf16_coop_128x256x64_c2x1();
Ops const& wgrad_bf16_fp32_sk_128x256x64_c2x1();
Ops const& wgrad_bf16_fp32_pp_128x128x64_c2x1();
// wgrad, bf16 -> fp32, adding into D only (beta = 1): TMA reduce-add, no C loads (ReduceAddEpilogue).
Ops const& wgrad_bf16_fp32_pp_128x128x64_c2x1_radd();

}  // namespace plain
}  // namespace coda::gemm
