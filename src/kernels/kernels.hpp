// Launchers of CODA's non-GEMM kernels (ARCHITECTURE.md layer 6): the RMSNorm final reduce and first-layer norm
// preparation, cross_entropy over stored logits and in exponential form, the RoPE backward with its row dot
// (rope_bwd_zdz), linear_rowscale_lse's log-sum-exp finish over the GEMM epilogue's per-tile partials, and the
// scale-and-cast of an fp32 gradient.
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

#include <coda/types.h>
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
  /// With reduction none: grad_loss is one scalar for every row (a chunk of a larger mean/sum, pre-scaled).
  bool grad_loss_scalar = false;
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
struct CrossEntropyStatsArgs {
  int64_t M = 0, V = 0;
  float const* lse = nullptr;           ///< [M] log-sum-exp of the (capped) logits
  float const* target_logit = nullptr;  ///< [M] (capped) target logit
  float const* logit_sum = nullptr;     ///< [M] sum of the (capped) logits (read only with label smoothing)
  void const* targets = nullptr;        ///< [M] int32 or int64
  bool targets_int64 = false;
  coda_ce_options options{};            ///< validated; softcap already applied by the producer of the statistics
  float* loss = nullptr;                ///< [M] for reduction none, a scalar for mean/sum
  void* workspace = nullptr;            ///< cross_entropy_workspace_size(M) bytes, 256-byte aligned
};
/// The loss of cross_entropy from per-row statistics instead of logits (the LM head without stored logits): loss[m] =
/// (1-ls)(lse - l_t) + ls (lse - sum/V) + z_loss lse^2 in double, 0 for ignored rows, reduced like cross_entropy (same
/// count and fixed-order reduction kernels).
void cross_entropy_from_stats(CrossEntropyStatsArgs const& args, cudaStream_t stream);
/// cross_entropy (coda_cross_entropy). Up to three kernels: the non-ignored row count (reduction mean only), one block
/// per row (statistics pass, then gradient pass), and a one-block fixed-order loss reduction (mean/sum).
void cross_entropy(CrossEntropyArgs const& args, cudaStream_t stream);
/// The per-row gradient scale of a mean-reduced loss for a caller that processes rows in chunks: out[0] =
/// (grad_loss ? grad_loss[0] : 1) / (number of rows m < M with targets[m] != ignore_index), in float exactly as
/// cross_entropy divides, and 0 when every row is ignored. One block.
void ce_mean_grad_scale(void const* targets, bool targets_int64, int64_t M, int64_t ignore_index,
                        float const* grad_loss, float* out, cudaStream_t stream);
/// The mean/sum of per-row losses [M] exactly as cross_entropy reduces them (double, fixed order; a mean divides by
/// the non-ignored rows, 0 when there are none). `count` is 8 bytes of device scratch.
void ce_reduce_rows(float const* loss_rows, int64_t M, void const* targets, bool targets_int64, int64_t ignore_index,
                    bool mean, unsigned long long* count, float* loss, cudaStream_t stream);

// ---- cross-entropy in exponential form, the LM head's backward (ce_exp.cu) -------------------------------------

/// One chunk of rows of the exponential-form LM-head backward (linear_cross_entropy_bwd; MATH.md, cross_entropy's
/// "exponential form"; label smoothing 0, bf16). The offset K, the E matrix and the per-tile sums come from
/// ops::linear_rowscale_exp.
struct CeExpArgs {
  int64_t M = 0, V = 0, d = 0;          ///< rows, vocabulary, hidden size (d % 8 == 0)
  void const* h = nullptr;              ///< [M, d] bf16, row stride ldh (16-byte aligned rows)
  int64_t ldh = 0;
  void const* w = nullptr;              ///< [>= V, d] bf16, row stride ldw (16-byte aligned rows)
  int64_t ldw = 0;
  float const* rstd = nullptr;          ///< [M]
  void const* targets = nullptr;        ///< [M] int32 or int64
  bool targets_int64 = false;
  int64_t ignore_index = -100;
  float softcap = 0.0f, z_loss = 0.0f;  ///< validated options (label smoothing must be 0)
  float const* grad_loss = nullptr;     ///< NULL (upstream 1), one scalar for every row, or [M]
  bool grad_loss_scalar = false;
  int64_t tiles = 0, ld = 0;            ///< partials [tiles, ld]: element (t, m) at m + ld t
  float const* part_sumexp = nullptr;   ///< sum_j exp(c_j - K) over the tile
  float const* part_dot = nullptr;      ///< sum_j l_j s_j exp(c_j - K) over the tile
  float* offset = nullptr;              ///< [M] K
  float* target_logit = nullptr;        ///< [M] l_t (raw, fp32), written by ce_exp_offset
  float* target_e = nullptr;            ///< [M] the GEMM's exp(c_t - K) (ce_exp_offset sets NaN: never read unset)
  float* target_lo = nullptr;           ///< [M] E[m, t] - R(E[m, t]) (0 for ignored rows), for ce_exp_target_fix
  void* e = nullptr;                    ///< [M, >= V] bf16 E, row stride ld_e
  int64_t ld_e = 0;
  float* loss = nullptr;                ///< [M] per-row loss (0 ignored, NaN for a target outside [0, V))
  float* v = nullptr;                   ///< [M] row scale of dl = v (.) E
  float* zdz = nullptr;                 ///< [M] zdz / v (cross_entropy's zdz divided by the row scale)
  int* flagged = nullptr;               ///< [M] scratch: the rows left to ce_exp_rescue
  unsigned* flag_count = nullptr;       ///< [1] scratch
};
/// l_t = rstd[m] <h_m, w_t> and K[m] = cap(l_t) in fp32 (K = +inf ignored, NaN out-of-range target); resets
/// *flag_count.
void ce_exp_offset(CeExpArgs const& args, cudaStream_t stream);
/// Per row from the partials: loss, v, zdz, E[m, t]; rows with lse - K > 40 (or a z-loss factor below 2^-10) are
/// listed for ce_exp_rescue instead.
void ce_exp_finish(CeExpArgs const& args, cudaStream_t stream);
/// ce_exp_target_fix's arguments: the chunk's rows, its wgrad output and the per-row residuals of E's target entry.
struct CeTargetFixArgs {
  int64_t M = 0, V = 0, d = 0;
  void const* targets = nullptr;  ///< [M] int32 or int64
  bool targets_int64 = false;
  float const* lo = nullptr;      ///< [M] CeExpArgs::target_lo
  void const* a = nullptr;        ///< [M, d] bf16 a_w (linear_residual_rmsnorm_bwd's a output), row stride ld_a
  int64_t ld_a = 0;
  float* dw = nullptr;            ///< fp32 rows [0, V8) of dW, row stride ld_dw
  int64_t ld_dw = 0;
  int64_t V8 = 0;                 ///< rows >= V8 go to dw_tail (V % 8 != 0)
  float* dw_tail = nullptr;       ///< [8, d] fp32 rows [V8, V8 + 8), or nullptr when V8 == V
};
/// dW[t_m, :] += lo_m a[m, :] for the rows with a real target and lo_m != 0: the target entry of E exactly, not its
/// bf16 rounding. Deterministic (each element updated by one thread, rows in index order).
void ce_exp_target_fix(CeTargetFixArgs const& args, cudaStream_t stream);
/// The listed rows recomputed with their row max as offset (E row, loss, v, zdz); up to sm_count blocks, each
/// exiting at once when the list is empty.
void ce_exp_rescue(CeExpArgs const& args, int sm_count, cudaStream_t stream);

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
/// What rope_bwd_args reads, by name (callers fill it with designated initializers, so that a swapped field is a
/// compile error, not a wrong gradient): validated row-major [M, W] qkv, dqkv and dz (dtype, M and row strides from
/// them), positions [M] int32, inv_freq fp32, zdz [M] fp32.
struct RopeBwdTensors {
  coda_tensor const& qkv;
  coda_tensor const& dqkv;
  coda_tensor const& positions;
  coda_tensor const& inv_freq;
  int32_t n_q_heads, n_kv_heads, head_dim;
  int64_t hidden_size;
  coda_tensor const& dz;
  float* zdz;
};
inline RopeBwdArgs rope_bwd_args(RopeBwdTensors const& t) {
  RopeBwdArgs k;
  k.dtype = t.qkv.dtype;
  k.M = t.qkv.sizes[0];
  k.n_q_heads = t.n_q_heads;
  k.n_kv_heads = t.n_kv_heads;
  k.head_dim = t.head_dim;
  k.qkv = t.qkv.data;
  k.ld_qkv = t.qkv.strides[0];
  k.dqkv = t.dqkv.data;
  k.ld_dqkv = t.dqkv.strides[0];
  k.positions = static_cast<int32_t const*>(t.positions.data);
  k.inv_freq = static_cast<float const*>(t.inv_freq.data);
  k.hidden_size = t.hidden_size;
  k.dz = t.dz.data;
  k.ld_dz = t.dz.strides[0];
  k.zdz = t.zdz;
  return k;
}
/// rope_bwd_zdz (coda_rope_bwd_zdz): dz = R(-theta) dqkv per q/k pair (2i, 2i+1) of each head, v passes through;
/// zdz[m] = (1/hidden_size) sum_j qkv[m,j] dqkv[m,j]. Angles pos * inv_freq and their sin/cos in double.
void rope_bwd_zdz(RopeBwdArgs const& args, cudaStream_t stream);

// ---- QK-norm + RoPE backward (qk_norm_rope_bwd.cu) --------------------------------------------------------------

struct QkNormRopeBwdArgs {
  coda_dtype dtype = CODA_BF16;  ///< z / dqkv / dz dtype
  int64_t M = 0;
  int32_t n_q_heads = 1, n_kv_heads = 1, head_dim = 64;  ///< width W = (n_q_heads + 2 n_kv_heads) head_dim
  void const* z = nullptr;       ///< [M, W] linear_rowscale_qk_norm_rope's pre-norm projection z, row stride ld_z
  int64_t ld_z = 0;
  void const* dqkv = nullptr;    ///< [M, W], row stride ld_dqkv
  int64_t ld_dqkv = 0;
  float const* q_gamma = nullptr;  ///< [head_dim]
  float const* k_gamma = nullptr;  ///< [head_dim]
  int32_t const* positions = nullptr;  ///< [M]
  float const* inv_freq = nullptr;     ///< [head_dim / 2]
  float eps = 1e-6f;
  int64_t hidden_size = 1;
  void* dz = nullptr;            ///< [M, W], row stride ld_dz; may be dqkv (same view)
  int64_t ld_dz = 0;
  float* zdz = nullptr;          ///< [M]
  float* dq_gamma = nullptr;     ///< [head_dim]
  float* dk_gamma = nullptr;     ///< [head_dim]
  void* workspace = nullptr;     ///< qk_norm_rope_bwd_workspace_bytes(M, head_dim) fp32 partials
};

/// What qk_norm_rope_bwd_args reads, by name (designated initializers at both callers, the C entry point and the
/// block): validated tensors as QkNormRopeBwdArgs describes them; dtype, M and row strides from z, dqkv and dz.
struct QkNormRopeBwdTensors {
  coda_tensor const& z;
  coda_tensor const& dqkv;
  coda_tensor const& q_gamma;
  coda_tensor const& k_gamma;
  coda_tensor const& positions;
  coda_tensor const& inv_freq;
  int32_t n_q_heads, n_kv_heads, head_dim;
  float eps;
  int64_t hidden_size;
  coda_tensor const& dz;
  float* zdz;
  float* dq_gamma;
  float* dk_gamma;
  void* workspace;
};
inline QkNormRopeBwdArgs qk_norm_rope_bwd_args(QkNormRopeBwdTensors const& t) {
  QkNormRopeBwdArgs k;
  k.dtype = t.z.dtype;
  k.M = t.z.sizes[0];
  k.n_q_heads = t.n_q_heads;
  k.n_kv_heads = t.n_kv_heads;
  k.head_dim = t.head_dim;
  k.z = t.z.data;
  k.ld_z = t.z.strides[0];
  k.dqkv = t.dqkv.data;
  k.ld_dqkv = t.dqkv.strides[0];
  k.q_gamma = static_cast<float const*>(t.q_gamma.data);
  k.k_gamma = static_cast<float const*>(t.k_gamma.data);
  k.positions = static_cast<int32_t const*>(t.positions.data);
  k.inv_freq = static_cast<float const*>(t.inv_freq.data);
  k.eps = t.eps;
  k.hidden_size = t.hidden_size;
  k.dz = t.dz.data;
  k.ld_dz = t.dz.strides[0];
  k.zdz = t.zdz;
  k.dq_gamma = t.dq_gamma;
  k.dk_gamma = t.dk_gamma;
  k.workspace = t.workspace;
  return k;
}
/// qk_norm_rope_bwd_zdz (coda_qk_norm_rope_bwd_zdz): dz of the per-head norm and RoPE from the pre-norm z, zdz for the
/// input norm's linear_residual_rmsnorm_bwd, and the q/k gamma gradients (per-block partials in the workspace, then
/// column_sum).
void qk_norm_rope_bwd_zdz(QkNormRopeBwdArgs const& args, cudaStream_t stream);
/// Bytes of its workspace: the gamma partials of at most 1024 blocks, 256-byte rounded; 0 for M <= 0.
size_t qk_norm_rope_bwd_workspace_bytes(int64_t M, int64_t head_dim);

// ---- RoPE frequencies for linear_rowscale_rope (rope_freq.cu) ----------------------------------------------------

/// out[n] = inv_freq[(n % head_dim) / 2] for the q and k columns n < (n_q_heads + n_kv_heads) * head_dim, 0 for the v
/// columns; out has (n_q_heads + 2 n_kv_heads) * head_dim floats (linear_rowscale_rope's per-column broadcast vector).
void expand_rope_inv_freq(float const* inv_freq, int32_t n_q_heads, int32_t n_kv_heads, int32_t head_dim,
                          float* out, cudaStream_t stream);

// ---- scale and cast (scale_cast.cu) -------------------------------------------------------------------------------

/// coda_scale_cast: out[i] = R(src[i] * scale[0]) for i < n: fp32 src, the fp32 scalar `scale` read on the device,
/// out bf16 or fp16 (out_dtype), the product in fp32 rounded once to nearest even. src and out contiguous and
/// disjoint; any alignment (16-byte vectors when both are 16-byte aligned).
void scale_cast(float const* src, float const* scale, coda_dtype out_dtype, void* out, int64_t n,
                cudaStream_t stream);

// ---- column partials (column_sum.cu) ----------------------------------------------------------------------------

/// out[n] = scale * sum_{t = 0 .. tiles-1} partials[t * ld + n] (double accumulation, fixed order, rounded once),
/// n < N; e.g. linear_residual_rmsnorm_bwd's dgamma from the dgrad epilogue's per-M-tile column partials,
/// linear_swiglu_bwd_zdz's zdz (scale 1/d) from its per-N-tile row partials. partials [tiles, ld >= N] fp32,
/// out [N] fp32.
void column_sum(float const* partials, int64_t tiles, int64_t ld, int64_t N, float* out, cudaStream_t stream,
                double scale = 1.0);

// ---- linear_rowscale_lse log-sum-exp finish (lse_finish.cu) -----------------------------------------------------

struct LseFinishArgs {
  int64_t M = 0, V = 0;
  int64_t tiles = 0;                   ///< T = ceil(V / tile_n)
  int64_t ld = 0;                      ///< Mpad: element (t, m) of a partial buffer is at m + ld * t
  int64_t tile_n = 0;                  ///< N-tile width of the GEMM that wrote the partials
  float const* part_max = nullptr;     ///< [T, ld] per-(row, tile) max of the (capped) logits
  float const* part_sumexp = nullptr;  ///< [T, ld] sum exp(l - max) over the tile
  float const* part_sum = nullptr;     ///< [T, ld] sum of l over the tile, or nullptr (then logit_sum unused)
  float const* part_target = nullptr;  ///< [T, ld] l[m, targets[m]], read only at the owning tile
  void const* targets = nullptr;       ///< [M] int32 or int64
  bool targets_int64 = false;
  int64_t ignore_index = -100;
  float* lse = nullptr;                ///< [M]
  float* target_logit = nullptr;       ///< [M]
  float* logit_sum = nullptr;          ///< [M] or nullptr (skip): sum over the row of l
};
/// lse[m] = max + log(sum_t se_t exp(mx_t - max)) (merge in double, in an order fixed by T); target_logit[m] = the
/// owning tile's partial, 0 for target == ignore_index; a target outside [0, V) that is not ignore_index makes
/// lse[m] and target_logit[m] NaN (no host sync). logit_sum[m] = sum_t part_sum (double, rounded once).
void lse_finish(LseFinishArgs const& args, cudaStream_t stream);

}  // namespace coda::kernels
