// B2 coda_linear_residual_rmsnorm_bwd (MATH.md B2): dgrad GEMM D = alpha * dz W with the RMSNorm backward in its
// epilogue. CUTLASS-free interface: the epilogue arguments and the getters of the compiled kernels (one per
// src/ops/linear_residual_rmsnorm_bwd/<config>.cu).
//
// Status (issue 5): the epilogue program and its kernel compile; the dispatch, the dgamma finishing kernel, the
// C ABI wiring and the GPU tests are the next step (coda_linear_residual_rmsnorm_bwd still returns
// CODA_ERROR_NOT_IMPLEMENTED).
#pragma once

#include "gemm/kernel_api.hpp"

#include <cstdint>

namespace coda::ops {

/// Run-time arguments of the B2 epilogue (besides Operands: A = dz [M,N'] K-major, B = w [N',N] N-major,
/// C = dx_in [M,N], D = dx [M,N]; C and D may be the same matrix for the in-place accumulation).
struct ResidualRmsnormBwdArgs {
  float alpha = 1.0f;              ///< scales the GEMM result (e.g. upstream gradient / token count for the LM head)
  void const* x = nullptr;         ///< [M,N] bf16 saved residual stream, row stride ldx (8-element aligned)
  int64_t ldx = 0;
  void const* gamma = nullptr;     ///< [N] bf16
  float const* rstd = nullptr;     ///< [M] fp32
  float const* zdz = nullptr;      ///< [M] fp32 row dot from the next layer (MATH.md rewrite 2)
  void* a = nullptr;               ///< [M,N] bf16 out: recomputed normalized input c * gamma, row stride lda
  int64_t lda = 0;
  float* dgamma_partials = nullptr;  ///< [ceil(M/CTA_M), round_up(N,CTA_N)] fp32 column partials of D * c
};

namespace residual_rmsnorm_bwd_kernels {
gemm::KernelOps<ResidualRmsnormBwdArgs> const& dgrad_bf16_pp_128x128x64_c2x1();
}  // namespace residual_rmsnorm_bwd_kernels

}  // namespace coda::ops
