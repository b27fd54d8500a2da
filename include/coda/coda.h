/*
 * CODA — Transformer-block ops rewritten as GEMM-epilogue programs (NVIDIA Hopper, sm_90a).
 *
 * The C ABI: the one surface that the PyTorch layer (through ctypes) and any other framework bind to.
 *
 * Conventions (every function below):
 *   - Returns a coda_status. On failure nothing was launched and no output was written; the reason is in
 *     coda_last_error() (thread-local, valid until the next CODA call on the same thread). The message names the
 *     argument and the rule it broke.
 *   - Tensors are described by coda_tensor (pointer, dtype, rank, sizes, strides in elements, device). Outputs are
 *     allocated by the caller. Activations are [M, features] row-major, weights [out_features, in_features]
 *     row-major (the nn.Linear layout). bf16 or fp16 data, fp32 accumulation and statistics.
 *   - TMA rule: data pointers and leading-dimension strides of every 2-D tensor must be 16-byte aligned (for 16-bit
 *     types: feature counts and row strides multiples of 8); the innermost stride must be 1 unless a function says
 *     otherwise. M (rows) is free.
 *   - Every tensor lives on the device of the stream's current CUDA device; `device` fields must agree.
 *   - Ops that need scratch memory take (workspace, workspace_bytes); coda_<op>_workspace_size() gives the bytes
 *     for a problem. Work is enqueued on `stream` (a cudaStream_t, NULL = legacy default stream); no host sync.
 *   - Each op's equations are in docs/MATH.md under the op's name.
 *   - Reductions are deterministic: same inputs, same bits.
 */
#ifndef CODA_CODA_H_
#define CODA_CODA_H_

#include <stddef.h>
#include <stdint.h>

#include "coda/types.h" /* coda_status, coda_dtype, coda_tensor, coda_ce_options, CODA_API */

#ifdef __cplusplus
extern "C" {
#endif

/** coda_ce_options with PyTorch's defaults: ignore_index -100, mean, no smoothing, no z-loss, no softcap. */
CODA_API coda_ce_options coda_ce_options_default(void);

/* ------------------------------------------------------------------------------------------------------------- */
/* Library and device                                                                                            */
/* ------------------------------------------------------------------------------------------------------------- */

/** The message of the last failed CODA call on this thread ("" if none). Never NULL. */
CODA_API const char* coda_last_error(void);
/** A fixed name for a status code, e.g. "CODA_ERROR_SHAPE". */
CODA_API const char* coda_status_string(coda_status status);
/** Library version as major*10000 + minor*100 + patch. */
CODA_API int coda_version(void);
/** The text of coda.h and block.h as this library was built with them (static storage, never NULL): for bindings
    that declare the C functions from it when they load the library (python/coda/_C.py) and so cannot drift from the
    ABI. */
CODA_API const char* coda_abi_declarations(void);
/** Size in bytes of one element of `dtype` (0 for an unknown value). */
CODA_API size_t coda_dtype_size(coda_dtype dtype);
/** The mainloop configs a fused op compiles for `dtype` (CODA_BF16 or CODA_FP16), comma-separated, e.g.
    "coop_128x256x64_c2x1,pp_128x128x64_c2x1": the names CODA_OP_CONFIG may pin for it. `op` is the op's C ABI
    name ("coda_" optional, e.g. "linear_rowscale_swiglu"). NULL for a name that is not a fused op or another
    dtype. Static storage; never needs a GPU. */
CODA_API const char* coda_fused_op_configs(const char* op, coda_dtype dtype);
/** The kernel a fused op runs for a GEMM of M x N x K (tokens, output columns, reduction length) in `dtype`, as
    "<config>[:<knobs>]", e.g. "pp_128x192x64_c2x1_e16:raster=n,swizzle=8" (the CODA_OP_CONFIG syntax): the op's
    tile policy (src/ops/<op>/op.cmake), after any CODA_OP_CONFIG pin. `op` is a C ABI name as for
    coda_fused_op_configs, or "<op>/<variant>" for an op's second kernel kind ("linear_rowscale_lse/nologits": no
    stored logits, the LM head's loss path; "linear_residual_rmsnorm_bwd/rowscaled": the LM head's dgrad, bf16
    only). NULL for an unknown name, another dtype, a negative extent or a bad CODA_OP_CONFIG, with the reason in
    coda_last_error(). Valid until the thread's next call; never needs a GPU. */
CODA_API const char* coda_fused_op_choice(const char* op, coda_dtype dtype, int64_t M, int64_t N, int64_t K);

/**
 * Whether `device` (CUDA ordinal, or -1 for the current device) can run CODA kernels.
 * On success *supported is 1 for compute capability 9.0 (H100/H200) and 0 otherwise, and *major / *minor (may be
 * NULL) receive the capability. Returns CODA_ERROR_ARCH (with the reason) when no CUDA device or driver exists;
 * then *supported is 0.
 */
CODA_API coda_status coda_device_supported(int device, int* supported, int* major, int* minor);

/* ------------------------------------------------------------------------------------------------------------- */
/* Forward ops                                                                                                   */
/* ------------------------------------------------------------------------------------------------------------- */

/**
 * Out-projection / down-projection with the residual add and the first half of the next RMSNorm.
 *   x = a w^T + residual            (x_out: the new residual stream)
 *   h = x * gamma                   (h_out: input of the next GEMM, not yet normalised)
 *   rstd[m] = 1 / sqrt(mean_n x[m,n]^2 + eps)   (from per-tile partial sums of squares, finished deterministically)
 * h and the sums of squares use x in fp32 (GEMM accumulator + residual) before x_out is rounded to the dtype, so
 * rstd and h match the fp32 x, not bit for bit the stored x. One fused GEMM launch + the rmsnorm_rstd reduce.
 * Kernels: bf16 and fp16.
 * \param a         [M,K] bf16|fp16, row-major.
 * \param w         [N,K] same dtype, row-major (nn.Linear weight).
 * \param residual  [M,N] same dtype. May alias x_out (in-place residual update); must not alias h_out.
 * \param gamma     [N] same dtype, contiguous.
 * \param eps       > 0.
 * \param x_out     [M,N] same dtype.  \param h_out [M,N] same dtype.  \param rstd_out [M] fp32, contiguous.
 * Workspace: coda_linear_residual_rmsnorm_workspace_size(M, N) bytes (the partials).
 */
CODA_API coda_status coda_linear_residual_rmsnorm(const coda_tensor* a, const coda_tensor* w,
                                                  const coda_tensor* residual, const coda_tensor* gamma, float eps,
                                                  coda_tensor* x_out, coda_tensor* h_out, coda_tensor* rstd_out,
                                                  void* workspace, size_t workspace_bytes, void* stream);
CODA_API size_t coda_linear_residual_rmsnorm_workspace_size(int64_t M, int64_t N);

/**
 * Final reduce of coda_linear_residual_rmsnorm (also usable on its own):
 *   rstd[m] = 1 / sqrt(sum_t partials[t,m] / n_features + eps).
 * In fp32: the partials of a row are added in tile order t = 0, 1, ..., T-1, then 1.0f / sqrtf(...) with IEEE
 * division and square root (deterministic, independent of the launch). M == 0: nothing is launched.
 * \param partials   [T,M] fp32, unit stride along M, row stride >= M (per-(row, N-tile) sums of squares).
 * \param n_features the row length N the squares were summed over (> 0).  \param eps > 0.
 * \param rstd_out   [M] fp32, contiguous. Must not overlap partials.
 */
CODA_API coda_status coda_rmsnorm_rstd(const coda_tensor* partials, int64_t n_features, float eps,
                                       coda_tensor* rstd_out, void* stream);

/**
 * First-layer norm preparation (no GEMM precedes the first norm):
 *   rstd[m] = 1 / sqrt(mean_n x[m,n]^2 + eps),  h = x * gamma.
 * One pass over x: the sum of squares is fp32 (fixed reduction order), h = x * gamma is formed in fp32 (exact for
 * 16-bit inputs) and rounded once to the dtype. Rows of x and h may be padded (row stride >= N). M == 0: no launch.
 * \param x [M,N] bf16|fp16 row-major (e.g. embeddings). \param gamma [N] same dtype. \param eps > 0.
 * \param h_out [M,N] same dtype (must not overlap x). \param rstd_out [M] fp32.
 */
CODA_API coda_status coda_rmsnorm_prepare(const coda_tensor* x, const coda_tensor* gamma, float eps,
                                          coda_tensor* h_out, coda_tensor* rstd_out, void* stream);

/**
 * y = diag(rstd) (h w^T) — the second half of RMSNorm-then-linear (rstd * accumulator in fp32, rounded once).
 * Kernels: bf16 and fp16.
 * \param h [M,K] bf16|fp16 row-major. \param w [N,K] same dtype. \param rstd [M] fp32.
 * \param y_out [M,N] same dtype.
 */
CODA_API coda_status coda_linear_rowscale(const coda_tensor* h, const coda_tensor* w, const coda_tensor* rstd,
                                          coda_tensor* y_out, void* workspace, size_t workspace_bytes,
                                          void* stream);
CODA_API size_t coda_linear_rowscale_workspace_size(int64_t M, int64_t N);

/**
 * Gate/up projection with SwiGLU, weights interleaved (rows g0,u0,g1,u1,...; coda_interleave_gate_up).
 *   z = diag(rstd) (h w_gu^T)   [M,2F] (saved for backward)
 *   y[m,i] = silu(z[m,2i]) * z[m,2i+1]   [M,F]
 * z and y are both computed from the fp32 z (rstd * accumulator) and rounded once each; silu uses the fast exp
 * (relative error ~1e-6, far below the output rounding). One fused GEMM launch, no workspace (workspace may be
 * NULL). Deterministic. z_out and y_out must not overlap each other or an input.
 * \param h [M,K] bf16 (fp16: gated as for coda_linear_rowscale). \param w_gu [2F,K] same dtype,
 *        interleaved; 2F a multiple of 16. \param rstd [M] fp32.
 * \param z_out [M,2F] same dtype. \param y_out [M,F] same dtype (F multiple of 8).
 */
CODA_API coda_status coda_linear_rowscale_swiglu(const coda_tensor* h, const coda_tensor* w_gu,
                                                 const coda_tensor* rstd, coda_tensor* z_out, coda_tensor* y_out,
                                                 void* workspace, size_t workspace_bytes, void* stream);
CODA_API size_t coda_linear_rowscale_swiglu_workspace_size(int64_t M, int64_t N);

/**
 * Q/k/v projection with RoPE. Columns of w_qkv are [q heads | k heads | v heads], each head_dim wide, q and k
 * rows paired per head (coda_pair_rope_rows). For q and k, pair i of a head at row m, theta = pos[m]*inv_freq[i]:
 *   out[2i] = z[2i] cos(theta) - z[2i+1] sin(theta);  out[2i+1] = z[2i+1] cos(theta) + z[2i] sin(theta)
 * with z = diag(rstd) (h w_qkv^T); v passes through.
 * Angles are accurate at large positions: theta = pos * inv_freq is formed exactly (float-float) and reduced by
 * 2 pi in extended precision before a hardware sin/cos, so the angle error stays below 1e-6 rad for positions
 * below 2^24 (a plain float angle is off by up to 4e-3 rad at 1e5); each output element is rounded once from fp32.
 * v columns are R(rstd * acc), not rotated. Launches a tiny kernel (inv_freq expanded per column into the
 * workspace), then one fused GEMM. Deterministic.
 * \param h [M,K] bf16 (fp16: gated as for coda_linear_rowscale). \param w_qkv
 *        [(Hq+2*Hkv)*head_dim, K] same dtype. \param rstd [M] fp32.
 * \param positions [M] int32, 0 <= pos < 2^24 (packed sequences: any order). \param inv_freq [head_dim/2] fp32
 *        (any frequencies: Llama-3.1 / YaRN scaling is the caller's choice).
 * \param n_q_heads >= 1; \param n_kv_heads >= 1, divides n_q_heads; \param head_dim 64 or 128.
 * \param qkv_out [M,(Hq+2*Hkv)*head_dim] same dtype.
 * Workspace: coda_linear_rowscale_rope_workspace_size(M, N) bytes (N floats, 256-byte rounded; 0 for M == 0).
 */
CODA_API coda_status coda_linear_rowscale_rope(const coda_tensor* h, const coda_tensor* w_qkv,
                                               const coda_tensor* rstd, const coda_tensor* positions,
                                               const coda_tensor* inv_freq, int32_t n_q_heads, int32_t n_kv_heads,
                                               int32_t head_dim, coda_tensor* qkv_out, void* workspace,
                                               size_t workspace_bytes, void* stream);
CODA_API size_t coda_linear_rowscale_rope_workspace_size(int64_t M, int64_t N);

/**
 * Q/k/v projection with QK-norm and RoPE (Qwen3; MATH.md `linear_rowscale_qk_norm_rope`): coda_linear_rowscale_rope
 * with a per-head RMSNorm of the q and k heads before RoPE. With u = diag(rstd) (h w_qkv^T) and, per q or k head of
 * row m, r = 1/sqrt(mean_j u_j^2 + qk_eps):
 *   n_j = u_j r gamma[j]   (gamma = q_gamma on q heads, k_gamma on k heads), then the RoPE rotation of n;
 * v passes through (out = u). Also stores z = u (the pre-norm projection the backward needs). qkv is computed from
 * the fp32 u and rounded once; z is R(u). Angles as coda_linear_rowscale_rope. One fused GEMM launch, no workspace.
 * Deterministic. Layout, heads, positions and inv_freq as coda_linear_rowscale_rope.
 * \param q_gamma, k_gamma [head_dim] fp32, in the paired column layout of the heads (coda_pair_rope_rows applied
 *        to the [head_dim, 1] weight), 8-byte aligned.
 * \param qk_eps finite, > 0 (the per-head norm's epsilon; Qwen3: the model's rms_norm_eps).
 * \param qkv_out, z_out [M,(Hq+2*Hkv)*head_dim] same dtype as h; must not overlap each other or an input. z_out may
 *        be NULL: z is not stored (inference; the backward needs it).
 * head_dim must be 64 or 128.
 */
CODA_API coda_status coda_linear_rowscale_qk_norm_rope(const coda_tensor* h, const coda_tensor* w_qkv,
                                                       const coda_tensor* rstd, const coda_tensor* q_gamma,
                                                       const coda_tensor* k_gamma, const coda_tensor* positions,
                                                       const coda_tensor* inv_freq, int32_t n_q_heads,
                                                       int32_t n_kv_heads, int32_t head_dim, float qk_eps,
                                                       coda_tensor* qkv_out, coda_tensor* z_out, void* stream);

/**
 * LM head logits with their log-sum-exp, without needing the logits stored.
 *   l = diag(rstd) (h w^T) [M,V], optionally l <- softcap * tanh(l / softcap);
 *   lse[m] = log sum_j exp(l[m,j]);  target_logit[m] = l[m, targets[m]] (0 for rows whose target is
 *   ignore_index).
 * One fused GEMM whose epilogue keeps an online (max, sum-exp) state per (row, 256-column N-tile) and captures the
 * target logit, then a small finishing kernel. l is rstd * accumulator in fp32 (never rounded for the statistics);
 * softcap is fp32 c * tanhf(l / c); the tile states are merged in double in an order fixed by V (no atomics):
 * same inputs, same bits. lse is computed for every row, ignored ones included; target_logit is the capped value.
 * A target outside [0,V) that is not ignore_index is reported without a host sync: that row's lse and
 * target_logit are NaN (as in coda_cross_entropy). M == 0: nothing is launched.
 * Kernels: bf16; fp16 gated as for coda_linear_rowscale.
 * \param h [M,K] bf16|fp16. \param w [V,K] same dtype. \param rstd [M] fp32.
 * \param targets [M] int32|int64; values in [0,V) or ignore_index.
 * \param softcap >= 0 (0 = off). \param ignore_index any value.
 * \param lse_out [M] fp32. \param target_logit_out [M] fp32.
 * \param logits_out NULL, or [M,V] same dtype as h to also store the logits (raw: before softcap, as
 *        coda_cross_entropy takes them), each rounded once from the fp32 l (V a multiple of 8: TMA rule).
 * Workspace: coda_linear_rowscale_lse_workspace_size(M, V) bytes: four fp32 [ceil(V/256), round_up(M,128)] partial
 * buffers (16 bytes per row and 256-column tile, e.g. 8 KB per token for V = 128256); scratch, rewritten on every
 * call.
 */
CODA_API coda_status coda_linear_rowscale_lse(const coda_tensor* h, const coda_tensor* w, const coda_tensor* rstd,
                                              const coda_tensor* targets, float softcap, int64_t ignore_index,
                                              coda_tensor* lse_out, coda_tensor* target_logit_out,
                                              coda_tensor* logits_out, void* workspace, size_t workspace_bytes,
                                              void* stream);
CODA_API size_t coda_linear_rowscale_lse_workspace_size(int64_t M, int64_t V);

/**
 * Cross-entropy over stored logits, with its gradient and the row dot for the norm backward.
 *   loss[m] = (1-ls)(lse - l_t) + ls (lse - mean_j l_j) + z_loss * lse^2 (0 for ignored rows), reduced per
 *   options->reduction; dlogits[m,j] = g_m (p_j - (1-ls)[j=t] - ls/V + 2 z_loss lse p_j) (* (1 - tanh^2) under
 *   softcap), 0 for ignored rows; zdz[m] = (1/hidden_size) sum_j l[m,j] dlogits[m,j] (l before softcap).
 * Statistics, loss and gradient are computed in fp32 (row scalars in double); each dlogits element is rounded once
 * to the logits dtype. zdz uses the fp32 gradient before that rounding and the raw logits as stored. Reductions
 * are deterministic (per-row losses in the workspace, then one fixed-order sum; no atomics).
 * A target outside [0,V) that is not ignore_index is an error that is reported without a host sync: that row's
 * loss, dlogits and zdz are NaN and it counts as a non-ignored row, so a mean or sum loss is NaN as well.
 * M == 0: nothing is launched; for mean/sum, loss_out is set to 0 (no workspace needed).
 * \param logits [M,V] bf16|fp16 row-major (raw, before softcap), any V and row stride (rows that are not
 *        16-byte vectors take a slower scalar path). \param targets [M] int32|int64.
 * \param options NULL for coda_ce_options_default().
 * \param grad_loss NULL (upstream gradient 1), a [] fp32 scalar (mean/sum), or [M] fp32 (reduction none).
 *        g_m = grad_loss / (number of non-ignored rows) for mean, grad_loss for sum, grad_loss[m] for none.
 * \param hidden_size d of the zdz scale (> 0); ignored when zdz_out is NULL.
 * \param loss_out [] fp32 for mean/sum, [M] fp32 for none.
 * \param dlogits_out NULL (loss only), or [M,V] same dtype as logits; may alias logits exactly (in place).
 * \param zdz_out NULL or [M] fp32 (requires dlogits_out).
 * Workspace: coda_cross_entropy_workspace_size(M, V) bytes (per-row losses and the non-ignored row count; it
 * depends on M only).
 */
CODA_API coda_status coda_cross_entropy(const coda_tensor* logits, const coda_tensor* targets,
                                        const coda_ce_options* options, const coda_tensor* grad_loss,
                                        int64_t hidden_size, coda_tensor* loss_out, coda_tensor* dlogits_out,
                                        coda_tensor* zdz_out, void* workspace, size_t workspace_bytes,
                                        void* stream);
CODA_API size_t coda_cross_entropy_workspace_size(int64_t M, int64_t V);

/**
 * LM head + cross-entropy loss without logits in memory (coda_linear_rowscale_lse, then the loss from row statistics,
 * MATH.md "LM head"):
 *   l = diag(rstd) (h w^T) [M,V] (softcapped per options->softcap), computed tile by tile inside the GEMM epilogue,
 *   which keeps only per-row statistics: lse, the target logit and (for label smoothing) the row sum of l; then
 *   loss[m] = (1-ls)(lse - l_t) + ls (lse - sum_j l_j / V) + z_loss * lse^2 (0 for ignored rows), reduced per
 *   options->reduction exactly as coda_cross_entropy does (mean over the non-ignored rows, deterministic).
 * Rows are processed in chunks of `chunk_rows` tokens (one fused GEMM + one tiny finishing kernel per chunk, then
 * one loss kernel), so the workspace is bounded by the chunk, never by M x V: about 16 bytes x chunk_rows x
 * ceil(V/256) for the tile statistics plus 16 bytes per row.
 * Statistics in fp32 (lse merged across tiles in double); the logits themselves are never rounded to bf16.
 * A target outside [0,V) that is not ignore_index makes that row's loss NaN (and a mean/sum loss NaN), without a
 * host sync. M == 0: nothing is launched; loss_out is 0 for mean/sum.
 * \param h [M,K] bf16|fp16. \param w [V,K] same dtype. \param rstd [M] fp32.
 * \param targets [M] int32|int64. \param options NULL for coda_ce_options_default().
 * \param chunk_rows rows per fused GEMM, >= 1, or 0 for the default (8192: each chunk's GEMM stays large).
 * \param loss_out [] fp32 for mean/sum, [M] fp32 for none.
 * \param lse_out NULL, or [M] fp32: the per-row log-sum-exp (of the capped logits), e.g. saved for the backward.
 * Workspace: coda_linear_cross_entropy_workspace_size(M, V, chunk_rows) bytes.
 */
CODA_API coda_status coda_linear_cross_entropy(const coda_tensor* h, const coda_tensor* w, const coda_tensor* rstd,
                                               const coda_tensor* targets, const coda_ce_options* options,
                                               int64_t chunk_rows, coda_tensor* loss_out, coda_tensor* lse_out,
                                               void* workspace, size_t workspace_bytes, void* stream);
CODA_API size_t coda_linear_cross_entropy_workspace_size(int64_t M, int64_t V, int64_t chunk_rows);

/**
 * Backward of the LM head + cross-entropy and of the final RMSNorm before it (the last layer's exit, MATH.md
 * `cross_entropy` and `linear_residual_rmsnorm_bwd`), chunked so that dlogits exist for `chunk_rows` tokens at a
 * time. Per chunk of rows:
 *   l = diag(rstd) (h w^T) (recomputed, as coda_linear_rowscale); dl, zdz as coda_cross_entropy computes them (with
 *   the gradient each row receives under options->reduction and grad_loss over all M rows: a mean divides by the
 *   number of non-ignored rows of the whole batch); then coda_linear_residual_rmsnorm_bwd with D = dl w:
 *   dx = dx_in + rstd (D gamma - c zdz), a = c gamma, c = x rstd; dW += dl^T a (fp32, across chunks);
 *   dgamma = sum over chunks (fixed order, deterministic).
 * bf16 without label smoothing runs the same math in exponential form (MATH.md `cross_entropy`'s exponential form;
 * the environment variable CODA_LCE_LOGITS=1 forces the logits path above): the recomputed GEMM stores s exp(c - K)
 * with one offset K per row (the capped target logit), a per-row scale v makes it dl, and no pass over the chunk's
 * [rows, V] runs between the GEMMs; a row whose per-token loss exceeds ~40 nats is recomputed with its row max as
 * offset.
 * \param h [M,d] bf16|fp16: x * gamma as given to the forward (keep it, or recompute with coda_rmsnorm_prepare).
 * \param w [V,d] same dtype, any V (V % 8 != 0: the chunks run on a zero-padded copy of w in the workspace).
 * \param rstd [M] fp32 (the final norm's). \param x [M,d] same dtype (the residual stream the final norm
 *        normalised). \param gamma [d] same dtype. \param targets [M] int32|int64.
 * \param options NULL for coda_ce_options_default(). \param grad_loss as coda_cross_entropy (NULL: 1).
 * \param chunk_rows rows per chunk, >= 1, or 0 for the default (2048: 0.5 GiB of bf16 dlogits at V = 128256).
 * \param dx_in NULL or [M,d]. \param dx_out [M,d] same dtype; may alias dx_in exactly (in place).
 * \param dw_out [V,d] fp32, overwritten. \param dgamma_out [d] fp32, overwritten.
 * \param loss_out NULL, or the loss as coda_linear_cross_entropy gives it ([] fp32 for mean/sum, [M] for none):
 *        a training step then needs no separate forward call (3 GEMMs of M x V x d per step instead of 4).
 * Workspace: coda_linear_cross_entropy_bwd_workspace_size(M, V, d, chunk_rows) bytes (one chunk of logits, a, zdz,
 * the per-row losses, the per-chunk dgamma rows and the ops' workspaces; for V % 8 != 0 also the padded copy of w
 * and an 8-row fp32 dW tail; the exponential form's per-row vectors and per-tile sums, 2 x 4 x chunk_rows x V/128
 * bytes).
 */
CODA_API coda_status coda_linear_cross_entropy_bwd(const coda_tensor* h, const coda_tensor* w,
                                                   const coda_tensor* rstd, const coda_tensor* x,
                                                   const coda_tensor* gamma, const coda_tensor* targets,
                                                   const coda_ce_options* options, const coda_tensor* grad_loss,
                                                   int64_t chunk_rows, const coda_tensor* dx_in, coda_tensor* dx_out,
                                                   coda_tensor* dw_out, coda_tensor* dgamma_out,
                                                   coda_tensor* loss_out, void* workspace, size_t workspace_bytes,
                                                   void* stream);
CODA_API size_t coda_linear_cross_entropy_bwd_workspace_size(int64_t M, int64_t V, int64_t d, int64_t chunk_rows);

/**
 * Scale and cast: out[i] = R(src[i] * scale) for every element, the product in fp32 rounded once to nearest even
 * into out's dtype (the same bits as torch.mul(src, scale, out=out)). What the LM head's training step applies in
 * the backward: its weight gradient, accumulated in fp32 for an upstream gradient of 1 (coda_linear_cross_entropy_bwd
 * with loss_out), times the actual upstream loss gradient, without a host sync and without an fp32 temporary.
 * \param src   fp32, contiguous (any rank; elements as laid out).
 * \param scale fp32 with exactly one element (e.g. [] or [1]) on the same device, read by the kernel.
 * \param out   bf16|fp16, contiguous, the same sizes as src; must not overlap src or scale.
 * Empty src: nothing is launched. Any data alignment (16-byte vectors when src and out are both 16-byte
 * aligned, as torch's allocations are).
 */
CODA_API coda_status coda_scale_cast(const coda_tensor* src, const coda_tensor* scale, coda_tensor* out, void* stream);

/* ------------------------------------------------------------------------------------------------------------- */
/* Backward ops                                                                                                  */
/* ------------------------------------------------------------------------------------------------------------- */

/**
 * RoPE backward with the row dot: dz = R(-theta) dqkv per q/k pair (v passes through), and
 *   zdz[m] = (1/hidden_size) sum_j qkv[m,j] dqkv[m,j]   (R is orthogonal, so pre-RoPE z is never needed).
 * theta = positions[m] * inv_freq[i] and its cos/sin are computed in double (accurate at any position, e.g. > 1e6),
 * then the rotation in fp32 with one rounding per output element; v columns are copied bit for bit; zdz is an fp32
 * sum in a fixed order (deterministic). M == 0: nothing is launched.
 * \param qkv [M,W] bf16|fp16 (rotated, as saved by coda_linear_rowscale_rope). \param dqkv [M,W] same dtype.
 * \param positions, inv_freq, n_q_heads, n_kv_heads, head_dim: as in coda_linear_rowscale_rope.
 * \param hidden_size d (> 0). \param dz_out [M,W] same dtype; may alias dqkv exactly (in place).
 * \param zdz_out [M] fp32.
 */
CODA_API coda_status coda_rope_bwd_zdz(const coda_tensor* qkv, const coda_tensor* dqkv,
                                       const coda_tensor* positions, const coda_tensor* inv_freq,
                                       int32_t n_q_heads, int32_t n_kv_heads, int32_t head_dim,
                                       int64_t hidden_size, coda_tensor* dz_out, coda_tensor* zdz_out,
                                       void* stream);

/**
 * QK-norm + RoPE backward (MATH.md `qk_norm_rope_bwd_zdz`): the backward of coda_linear_rowscale_qk_norm_rope's
 * per-head norm and RoPE, from its pre-norm z_out. Per q or k head of row m, with u = z[m, head],
 * r = 1/sqrt(mean_j u_j^2 + qk_eps), nh = u r, g = q_gamma (q heads) or k_gamma (k heads) and dn = R(-theta) dqkv
 * per pair:
 *   dz = r (g dn - nh <dn, nh g> / head_dim);   v heads: dz = dqkv (bit for bit);
 *   zdz[m] = (1/hidden_size) sum_j z[m,j] dz[m,j] (fp32, dz before its rounding);
 *   dq_gamma[j] = sum over rows and q heads of dn_j nh_j, dk_gamma likewise over k heads (fp32).
 * Angles in double as coda_rope_bwd_zdz; the head's sums in fp32; each dz element rounded once. Deterministic (the
 * gamma gradients: per-block partials in the workspace, summed in a fixed order). M == 0: nothing is launched.
 * \param z [M,W] bf16|fp16 (z_out of coda_linear_rowscale_qk_norm_rope). \param dqkv [M,W] same dtype.
 * \param q_gamma, k_gamma, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, qk_eps: as given to the forward.
 * \param hidden_size d (> 0). \param dz_out [M,W] same dtype; may alias dqkv exactly (in place), not z.
 * \param zdz_out [M] fp32. \param dq_gamma_out, dk_gamma_out [head_dim] fp32.
 * Workspace: coda_qk_norm_rope_bwd_zdz_workspace_size(M, head_dim) bytes (at most 1 MiB), 256-byte aligned
 * (cudaMalloc's alignment).
 */
CODA_API coda_status coda_qk_norm_rope_bwd_zdz(const coda_tensor* z, const coda_tensor* dqkv,
                                               const coda_tensor* q_gamma, const coda_tensor* k_gamma,
                                               const coda_tensor* positions, const coda_tensor* inv_freq,
                                               int32_t n_q_heads, int32_t n_kv_heads, int32_t head_dim, float qk_eps,
                                               int64_t hidden_size, coda_tensor* dz_out, coda_tensor* zdz_out,
                                               coda_tensor* dq_gamma_out, coda_tensor* dk_gamma_out,
                                               void* workspace, size_t workspace_bytes, void* stream);
CODA_API size_t coda_qk_norm_rope_bwd_zdz_workspace_size(int64_t M, int64_t head_dim);

/**
 * Dgrad of a linear whose input was a = rstd * x * gamma, fused with the RMSNorm backward.
 *   D = alpha * dz w;  c = x * rstd;
 *   dx = dx_in + rstd * (D * gamma - alpha * c * zdz)   (dx_in = 0 when NULL)
 *   a  = c * gamma                              (recomputed normalised input, for dW = dz^T a)
 *   dgamma[n] = sum_m D[m,n] c[m,n]             (per-tile partials, finished deterministically)
 * \param dz [M,N'] bf16|fp16. \param w [N',N] same dtype. \param x [M,N]. \param gamma [N]. \param rstd [M] fp32.
 * \param zdz [M] fp32: (1/N) sum_j z dz for the dz passed here (as coda_cross_entropy, coda_rope_bwd_zdz and
 *        coda_linear_swiglu_bwd_zdz produce it); alpha scales it with D.
 * \param dx_in NULL or [M,N] same dtype.
 * \param alpha scale of dz (1 normally; e.g. upstream gradient / token count for the LM head).
 * \param dx_out [M,N]; may alias dx_in exactly (in-place accumulation), must not alias x or a_out.
 * \param a_out [M,N] same dtype. \param dgamma_out [N] fp32.
 * Kernels: bf16 and fp16. Without dx_in, dx_out is zero-filled first and read back as C.
 * Workspace: coda_linear_residual_rmsnorm_bwd_workspace_size(M, N) bytes (the dgamma column partials).
 */
CODA_API coda_status coda_linear_residual_rmsnorm_bwd(const coda_tensor* dz, const coda_tensor* w,
                                                      const coda_tensor* x, const coda_tensor* gamma,
                                                      const coda_tensor* rstd, const coda_tensor* zdz,
                                                      const coda_tensor* dx_in, float alpha, coda_tensor* dx_out,
                                                      coda_tensor* a_out, coda_tensor* dgamma_out, void* workspace,
                                                      size_t workspace_bytes, void* stream);
CODA_API size_t coda_linear_residual_rmsnorm_bwd_workspace_size(int64_t M, int64_t N);

/**
 * Dgrad of the down-projection fused with the SwiGLU backward.
 *   dy = dx w_down [M,F]; per pair (g,u) = (z[2i], z[2i+1]), s = sigmoid(g):
 *   dz[2i] = dy u s (1 + g (1-s)),  dz[2i+1] = dy silu(g),  y = silu(g) u,
 *   zdz[m] = (1/d) sum_i (g dz[2i] + u dz[2i+1])  with d = dx.sizes[1].
 * dy stays in fp32 (the GEMM accumulator, never rounded); dz and y are rounded once; zdz uses the fp32 dz values
 * and is finished from per-tile partials in a fixed order (deterministic). One fused GEMM launch + one tiny reduce.
 * Kernels: bf16 and fp16.
 * \param dx [M,d] bf16|fp16 (gradient of the residual stream after the MLP). \param w_down [d,F] same dtype.
 * \param z [M,2F] same dtype (interleaved gate/up pre-activation, as coda_linear_rowscale_swiglu saved it).
 * \param dz_out [M,2F] same dtype; may alias z exactly (in place: z is dead after this op).
 * \param y_out [M,F] same dtype (the recomputed MLP activation, for dW_down = dx^T y).
 * \param zdz_out [M] fp32. F % 8 == 0 (TMA); M == 0 writes nothing.
 * Workspace: coda_linear_swiglu_bwd_zdz_workspace_size(M, F) bytes (the zdz row partials).
 */
CODA_API coda_status coda_linear_swiglu_bwd_zdz(const coda_tensor* dx, const coda_tensor* w_down,
                                                const coda_tensor* z, coda_tensor* dz_out, coda_tensor* y_out,
                                                coda_tensor* zdz_out, void* workspace, size_t workspace_bytes,
                                                void* stream);
CODA_API size_t coda_linear_swiglu_bwd_zdz_workspace_size(int64_t M, int64_t N);

/* ------------------------------------------------------------------------------------------------------------- */
/* Plain GEMM                                                                                                    */
/* ------------------------------------------------------------------------------------------------------------- */

/**
 * d = alpha * a b^T (+ d when accumulate != 0), fp32 accumulation.
 * \param a [M,K] bf16|fp16, row-major (strides [lda,1]) or column-major (strides [1,lda]) — a transposed view such
 *          as dz^T for the weight gradient dW = dz^T a is passed as-is.
 * \param b [N,K] same dtype, row-major (nn.Linear weight) or column-major (e.g. w^T for the dgrad dz w).
 * \param d [M,N] bf16|fp16|fp32, row-major; must not overlap a or b.
 * \param alpha scale. \param accumulate 0: overwrite d; 1: d += alpha a b^T (fp32 d for split weight gradients).
 * Leading dimensions must be multiples of 8 elements (16 bytes for 16-bit types), pointers 16-byte aligned.
 * Kernel: the autotuned fastest of CODA's CUTLASS kernels and cuBLAS for the shape (first call per shape times
 * them; docs/GEMM.md). While `stream` is capturing a CUDA graph, a CODA kernel runs instead of cuBLAS (cuBLAS
 * failed inside captures), so a graph may differ from eager execution in the last bits.
 */
CODA_API coda_status coda_gemm(const coda_tensor* a, const coda_tensor* b, coda_tensor* d, float alpha,
                               int accumulate, void* workspace, size_t workspace_bytes, void* stream);
CODA_API size_t coda_gemm_workspace_size(int64_t M, int64_t N, int64_t K);

/* ------------------------------------------------------------------------------------------------------------- */
/* Weight layout helpers (pure row permutations, done once at load/save time)                                    */
/* ------------------------------------------------------------------------------------------------------------- */

/**
 * Stacked gate/up [W_gate; W_up] ([2F,K]) -> interleaved (row 2i <- gate i, row 2i+1 <- up i).
 * \param w_stacked [2F,K] bf16|fp16|fp32, contiguous. \param w_out [2F,K] same dtype, contiguous, must not overlap.
 */
CODA_API coda_status coda_interleave_gate_up(const coda_tensor* w_stacked, coda_tensor* w_out, void* stream);
/** Inverse of coda_interleave_gate_up. */
CODA_API coda_status coda_deinterleave_gate_up(const coda_tensor* w_interleaved, coda_tensor* w_out,
                                               void* stream);
/**
 * Rotate-half (HF/NeoX) q or k rows -> pairs adjacent, per head: new row 2i <- old i, new row 2i+1 <- old i+hd/2.
 * \param w [H*head_dim, K] (or [H*head_dim] for a bias) bf16|fp16|fp32, contiguous. \param head_dim even, >= 2.
 * \param w_out same shape and dtype, contiguous, must not overlap w.
 */
CODA_API coda_status coda_pair_rope_rows(const coda_tensor* w, int32_t head_dim, coda_tensor* w_out,
                                         void* stream);
/** Inverse of coda_pair_rope_rows. */
CODA_API coda_status coda_unpair_rope_rows(const coda_tensor* w, int32_t head_dim, coda_tensor* w_out,
                                           void* stream);

#ifdef __cplusplus
}  // extern "C"
#endif

/* The block API (forward/backward of a whole CODA block, built from the ops above). */
#include <coda/block.h>

#endif  // CODA_CODA_H_
