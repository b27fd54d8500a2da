// coda_linear_residual_rmsnorm_bwd (MATH.md): dgrad GEMM D = alpha * dz W with the RMSNorm backward in its
// epilogue. CUTLASS-free interface: the epilogue arguments and the dispatch (the compiled kernels: op.cmake).
#pragma once

#include "gemm/kernel_api.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace coda::ops {

/// Run-time arguments of the linear_residual_rmsnorm_bwd epilogue (besides Operands: A = dz [M,N'] K-major,
/// B = w [N',N] N-major, C = dx_in [M,N], D = dx [M,N]; C and D may be the same matrix for the in-place
/// accumulation).
struct ResidualRmsnormBwdArgs {
  float alpha = 1.0f;              ///< scales the GEMM result (e.g. upstream gradient / token count for the LM head); the
                                   ///< epilogue applies it to dx, the dispatch to the finished dgamma sums
  void const* x = nullptr;         ///< [M,N] bf16|fp16 (the GEMM's dtype) saved residual stream, row stride ldx (8-element aligned)
  int64_t ldx = 0;
  void const* gamma = nullptr;     ///< [N] bf16
  float const* rstd = nullptr;     ///< [M] fp32
  float const* zdz = nullptr;      ///< [M] fp32 row dot from the next layer (MATH.md rewrite 2), not scaled by alpha
  void* a = nullptr;               ///< [M,N] bf16 out: recomputed normalized input c * gamma, row stride lda
  int64_t lda = 0;
  float* dgamma_partials = nullptr;  ///< [ceil(M/CTA_M), round_up(N,CTA_N)] fp32 column partials of acc * c
  float const* row_scale = nullptr;  ///< [M] fp32 v, read by the row-scaled kernels only (epilogue.hpp)
};

/// linear_residual_rmsnorm_bwd on bf16|fp16 tensors (row-major with the given row strides): dz [M,Nd], w [Nd,N],
/// x [M,N], gamma [N], rstd and zdz [M] fp32, dx_in nullptr or [M,N] (may be dx), dx and a [M,N], dgamma [N] fp32.
/// `workspace` holds the column partials (at least coda_linear_residual_rmsnorm_bwd_workspace_size(M, N) bytes,
/// 16-byte aligned). Enqueues (a zero fill of dx when dx_in is nullptr,) the fused dgrad GEMM and the dgamma finishing
/// kernel on `stream`. row_scale: nullptr, or [M] fp32 v (bf16 only): D = alpha v (.) (dz W), zdz given divided by v,
/// a = R(v c gamma) (epilogue.hpp); CODA_OP_CONFIG does not apply to it. Throws coda::detail::Error.
void linear_residual_rmsnorm_bwd(int64_t M, int64_t N, int64_t Nd, void const* dz, int64_t ldz, void const* w,
                                 int64_t ldw, void const* x, int64_t ldx, void const* gamma, float const* rstd,
                                 float const* zdz, void const* dx_in, int64_t ld_dx_in, float alpha, void* dx,
                                 int64_t ld_dx, void* a, int64_t ld_a, float* dgamma, bool fp16, void* workspace,
                                 size_t workspace_bytes, cudaStream_t stream, float const* row_scale = nullptr);

}  // namespace coda::ops
