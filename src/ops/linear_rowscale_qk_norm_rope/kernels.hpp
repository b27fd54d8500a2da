// coda_linear_rowscale_qk_norm_rope: qkv = rope(qk_norm(diag(rstd) (h w_qkv^T))) and the pre-norm
// z = diag(rstd) (h w_qkv^T) (the backward's input). CUTLASS-free interface: the epilogue arguments and the dispatch
// (the compiled kernels: op.cmake). docs/OPS.md.
#pragma once

#include "gemm/kernel_api.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace coda::ops {

/// Run-time arguments of the QK-norm + RoPE epilogue (besides Operands: A = h, B = w_qkv, D = qkv, no C).
struct QkNormRopeArgs {
  float const* rstd = nullptr;         ///< [M] fp32
  void* z = nullptr;                   ///< [M, N] out, D's element type: R(rstd * acc), before the per-head norm;
                                       ///< nullptr: not stored (forward only)
  int64_t ldz = 0;
  float const* q_gamma = nullptr;      ///< [head_dim] fp32, paired layout
  float const* k_gamma = nullptr;      ///< [head_dim] fp32, paired layout
  float const* inv_freq = nullptr;     ///< [head_dim / 2] fp32
  int32_t const* positions = nullptr;  ///< [M] int32, 0 <= pos < 2^24
  int32_t n_q_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;  ///< 64 or 128
  float eps = 0.0f;
};

/// qkv[M,N] (row stride ldq) and z[M,N] (row stride ldz), bf16 or fp16, N = (Hq + 2 Hkv) head_dim, from h[M,K] and
/// w_qkv[N,K] (q/k rows paired per head). One GEMM on `stream`. Throws coda::detail::Error.
void linear_rowscale_qk_norm_rope(int64_t M, int64_t N, int64_t K, void const* h, int64_t ldh, void const* w_qkv,
                                  int64_t ldw, QkNormRopeArgs const& args, void* qkv, int64_t ldq, bool fp16,
                                  cudaStream_t stream);

}  // namespace coda::ops
