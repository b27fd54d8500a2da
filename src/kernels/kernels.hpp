// Launchers of CODA's non-GEMM kernels (ARCHITECTURE.md layer 6): the RMSNorm final reduce and first-layer norm
// preparation, cross-entropy (F6) over stored logits, and the RoPE backward with its row dot (B1).
//
// Plain host declarations: no CUTLASS, no device code, includable from any .cpp. Arguments are assumed valid
// (src/api validates them first). Every launcher enqueues its kernels on `stream` without a host sync, checks each
// launch (CODA_CUDA_CHECK(cudaGetLastError()), so a failure throws coda::detail::Error(CODA_ERROR_CUDA)), and does
// nothing for M == 0. Reductions have a fixed order that depends only on the shape: same inputs, same bits.
//
// Row-major matrices are given by a base pointer and a row stride `ld` in elements (ld >= row length; any value
// when M <= 1). The kernels use 16-byte vector accesses whenever the row length is a multiple of 8 elements and
// every row start is 16-byte aligned. rmsnorm_prepare and cross_entropy fall back to a scalar path otherwise (a
// gamma that is not 16-byte aligned, V = 1 as a column view); rope_bwd_zdz requires the vector layout (the API
// guarantees it: TMA rule, head_dim 64 or 128).
#pragma once

#include <coda/coda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace coda::kernels {

// ---- RMSNorm (rmsnorm.cu) ---------------------------------------------------------------------------------------

/// coda_rmsnorm_rstd: rstd[m] = 1 / sqrt(sum_t partials[t * ld + m] / n_features + eps), fp32, summed over
/// t = 0 .. T-1 in order. partials [T, M] fp32 with row stride ld >= M; rstd [M] fp32.
void rmsnorm_rstd(float const* partials, int64_t T, int64_t M, int64_t ld, int64_t n_features, float eps,
                  float* rstd, cudaStream_t stream);

struct RmsnormPrepareArgs {
  coda_dtype dtype = CODA_BF16;  ///< CODA_BF16 or CODA_FP16 (x, gamma and h)
  int64_t M = 0, N = 0;
  void const* x = nullptr;       ///< [M, N], row stride ldx
  int64_t ldx = 0;
  void const* gamma = nullptr;   ///< [N], contiguous
  float eps = 0;
  void* h = nullptr;             ///< [M, N], row stride ldh; must not overlap x
  int64_t ldh = 0;
  float* rstd = nullptr;         ///< [M]
};
/// coda_rmsnorm_prepare: rstd[m] = 1 / sqrt(sum_n x^2 / N + eps) (fp32 sum of squares), h = R(x * gamma) (product
/// in fp32, rounded once to the dtype). One pass over x.
void rmsnorm_prepare(RmsnormPrepareArgs const& args, cudaStream_t stream);

// ---- cross-entropy (cross_entropy.cu) ---------------------------------------------------------------------------

struct CrossEntropyArgs {
  coda_dtype dtype = CODA_BF16;    ///< logits / dlogits dtype: CODA_BF16 or CODA_FP16
  int64_t M = 0, V = 0;
  void const* logits = nullptr;    ///< [M, V] raw (pre-softcap) logits, row stride ld_logits
  int64_t ld_logits = 0;
  void const* targets = nullptr;   ///< [M] int32 or int64
  bool targets_int64 = false;
  coda_ce_options options{};       ///< validated options (never NULL here)
  float const* grad_loss = nullptr;  ///< NULL (upstream 1), a scalar (mean/sum) or [M] (reduction none)
  int64_t hidden_size = 1;         ///< zdz scale 1/hidden_size (only used with zdz)
  float* loss = nullptr;           ///< [M] for reduction none, a scalar for mean/sum
  void* dlogits = nullptr;         ///< NULL, or [M, V] in the logits dtype, row stride ld_dlogits; may be logits
  int64_t ld_dlogits = 0;
  float* zdz = nullptr;            ///< NULL or [M] (requires dlogits)
  void* workspace = nullptr;       ///< cross_entropy_workspace_size(M) bytes, 256-byte aligned
};
/// Workspace of cross_entropy: per-row losses (fp32 [M]) followed by the non-ignored row count (uint64), each in
/// its own 256-byte-aligned slot. 0 for M <= 0.
size_t cross_entropy_workspace_size(int64_t M);
/// F6 (coda_cross_entropy). Up to three kernels: the non-ignored row count (reduction mean only), one block per row
/// (statistics pass, then gradient pass), and a one-block fixed-order loss reduction (mean/sum).
void cross_entropy(CrossEntropyArgs const& args, cudaStream_t stream);

// ---- RoPE backward (rope_bwd.cu) --------------------------------------------------------------------------------

struct RopeBwdArgs {
  coda_dtype dtype = CODA_BF16;  ///< qkv / dqkv / dz dtype
  int64_t M = 0;
  int32_t n_q_heads = 1, n_kv_heads = 1, head_dim = 64;  ///< width W = (n_q_heads + 2 n_kv_heads) head_dim
  void const* qkv = nullptr;     ///< [M, W], row stride ld_qkv
  int64_t ld_qkv = 0;
  void const* dqkv = nullptr;    ///< [M, W], row stride ld_dqkv
  int64_t ld_dqkv = 0;
  int32_t const* positions = nullptr;  ///< [M]
  float const* inv_freq = nullptr;     ///< [head_dim / 2]
  int64_t hidden_size = 1;
  void* dz = nullptr;            ///< [M, W], row stride ld_dz; may be dqkv (same view)
  int64_t ld_dz = 0;
  float* zdz = nullptr;          ///< [M]
};
/// B1 (coda_rope_bwd_zdz): dz = R(-theta) dqkv per q/k pair (2i, 2i+1) of each head, v passes through;
/// zdz[m] = (1/hidden_size) sum_j qkv[m,j] dqkv[m,j]. Angles pos * inv_freq and their sin/cos in double.
void rope_bwd_zdz(RopeBwdArgs const& args, cudaStream_t stream);

}  // namespace coda::kernels
