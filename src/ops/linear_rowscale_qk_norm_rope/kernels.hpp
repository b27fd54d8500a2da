// coda_linear_rowscale_qk_norm_rope: qkv = rope(qk_norm(diag(rstd) (h w_qkv^T))) and the pre-norm
// z = diag(rstd) (h w_qkv^T) (the backward's input). CUTLASS-free interface: the epilogue arguments and the dispatch
// (the compiled kernels: op.cmake). docs/OPS.md.
#pragma once

#include "gemm/kernel_api.hpp"

#include <coda/types.h>
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

/// The arguments from validated tensors (the C entry point and the block build them the same way): rstd [M] fp32,
/// z [M, N] or nullptr (not stored), the gammas [head_dim] fp32, positions [M] int32, inv_freq [head_dim / 2] fp32.
inline QkNormRopeArgs qk_norm_rope_args(float const* rstd, coda_tensor const* z, coda_tensor const& q_gamma,
                                        coda_tensor const& k_gamma, coda_tensor const& positions,
                                        coda_tensor const& inv_freq, int32_t n_q_heads, int32_t n_kv_heads,
                                        int32_t head_dim, float eps) {
  QkNormRopeArgs args;
  args.rstd = rstd;
  args.z = z != nullptr ? z->data : nullptr;
  args.ldz = z != nullptr ? z->strides[0] : 0;  // make_args substitutes a legal stride for a single row
  args.q_gamma = static_cast<float const*>(q_gamma.data);
  args.k_gamma = static_cast<float const*>(k_gamma.data);
  args.inv_freq = static_cast<float const*>(inv_freq.data);
  args.positions = static_cast<int32_t const*>(positions.data);
  args.n_q_heads = n_q_heads;
  args.n_kv_heads = n_kv_heads;
  args.head_dim = head_dim;
  args.eps = eps;
  return args;
}

/// qkv[M,N] (row stride ldq) and z[M,N] (row stride ldz), bf16 or fp16, N = (Hq + 2 Hkv) head_dim, from h[M,K] and
/// w_qkv[N,K] (q/k rows paired per head). One GEMM on `stream`. Throws coda::detail::Error.
void linear_rowscale_qk_norm_rope(int64_t M, int64_t N, int64_t K, void const* h, int64_t ldh, void const* w_qkv,
                                  int64_t ldw, QkNormRopeArgs const& args, void* qkv, int64_t ldq, bool fp16,
                                  cudaStream_t stream);

}  // namespace coda::ops
