// coda_linear_rowscale_rope: qkv = rope(diag(rstd) (h w_qkv^T)) with per-row positions and a per-column
// inv_freq vector (0 on the v columns). CUTLASS-free interface: the epilogue arguments and the dispatch (the
// compiled kernels: op.cmake). docs/OPS.md.
#pragma once

#include "gemm/kernel_api.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace coda::ops {

/// Run-time arguments of the rowscale + RoPE epilogue (besides Operands: A = h, B = w_qkv, D = qkv, no C).
struct RopeArgs {
  float const* rstd = nullptr;          ///< [M] fp32
  int32_t const* positions = nullptr;   ///< [M] int32, 0 <= pos < 2^24 (exact as float)
  float const* inv_freq_cols = nullptr; ///< [N] fp32: per-column frequency, 0 on v columns
  // The head-aware program's (a config with kCacheSinCos, or of 192 accumulators per thread: epilogue/rope_heads.hpp):
  float const* inv_freq = nullptr;      ///< [head_dim / 2] fp32, the caller's
  int32_t n_rot_heads = 0;              ///< q heads + k heads
  int32_t head_dim = 0;                 ///< 64 or 128
};

/// Workspace of linear_rowscale_rope: the expanded per-column inv_freq (N floats, 256-byte rounded).
size_t linear_rowscale_rope_workspace_bytes(int64_t N);

/// qkv[M,N] (bf16 or fp16; row stride ldq) = rope(rstd[m] * (h[M,K] w_qkv[N,K]^T)), N = (Hq + 2 Hkv) head_dim, q/k rows
/// of w_qkv paired per head. Enqueues the inv_freq expansion (into `workspace`) and one GEMM on `stream`.
/// Throws coda::detail::Error.
void linear_rowscale_rope(int64_t M, int64_t N, int64_t K, void const* h, int64_t ldh, void const* w_qkv,
                          int64_t ldw, float const* rstd, int32_t const* positions, float const* inv_freq,
                          int32_t n_q_heads, int32_t n_kv_heads, int32_t head_dim, void* qkv, int64_t ldq,
                          void* workspace, size_t workspace_bytes, bool fp16, cudaStream_t stream);

}  // namespace coda::ops
