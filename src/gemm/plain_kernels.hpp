// The plain GEMM's epilogue arguments and kernel naming (CUTLASS-free). Its compiled kernels are listed in
// src/gemm/plain.cmake; the build generates one definition per kernel and their declarations
// (generated/gemm/plain_instances.hpp).
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

}  // namespace plain
}  // namespace coda::gemm
