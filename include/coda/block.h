/*
 * CODA block API (C ABI): one LLaMA-style block as CODA fuses it, forward and backward (MATH.md "One block").
 *
 * A CODA block runs from layer i's attention output to layer i+1's q/k/v (attention itself, between blocks, is the
 * framework's: e.g. scaled_dot_product_attention on `qkv`):
 *   forward:  x1 = y0 W_o^T + x0;  rstd1, h1 = x1 gamma1                (coda_linear_residual_rmsnorm)
 *             z1 = rstd1 (h1 W_gu^T);  y1 = silu(z1 even) z1 odd         (coda_linear_rowscale_swiglu)
 *             x2 = y1 W_down^T + x1;  rstd2, h2 = x2 gamma2              (coda_linear_residual_rmsnorm)
 *             qkv = RoPE(rstd2 (h2 W_qkv^T))                             (coda_linear_rowscale_rope)
 *             with QK-norm (config.qk_eps > 0, Qwen3): qkv = RoPE(qk_norm(z)), z = rstd2 (h2 W_qkv^T) saved
 *                                                                        (coda_linear_rowscale_qk_norm_rope)
 *   backward: coda_rope_bwd_zdz (with QK-norm: coda_qk_norm_rope_bwd_zdz, also the q/k gamma gradients) ->
 *             coda_linear_residual_rmsnorm_bwd with W_qkv (dx2) -> dW_qkv ->
 *             coda_linear_swiglu_bwd_zdz with W_down (dz1, y1) -> dW_down -> coda_linear_residual_rmsnorm_bwd with
 *             W_gu (dx1 = dx0) -> dW_gu -> dy0 = dx1 W_o -> dW_o: 3 fused dgrad GEMMs, 5 plain GEMMs, one
 *             elementwise kernel (with QK-norm: one kernel and its gamma reduce), 2 tiny reduces.
 * Saved between forward and backward (coda_block_saved): x1, rstd1, z1, x2, rstd2, qkv, with QK-norm also the
 * pre-norm z (plus the caller's y0, positions, inv_freq and weights). Not saved, recomputed in the backward
 * epilogues: h1, h2, y1 and (without QK-norm) the pre-RoPE q/k/v; per token that is 2 d + F + (hq + 2 hkv) hd
 * elements fewer than an unfused pipeline keeps (2 d + F with QK-norm).
 * The first layer (embeddings -> q/k/v: coda_rmsnorm_prepare + coda_linear_rowscale_rope) and the last (-> LM head:
 * coda_linear_cross_entropy) use the single ops.
 *
 * Conventions: all activations and weights bf16 or fp16 (one dtype), row-major with 16-byte aligned rows;
 * rstd fp32; M (tokens) any value >= 0; weights in CODA's layout (gate/up interleaved: coda_interleave_gate_up;
 * q/k rows RoPE-paired per head: coda_pair_rope_rows). Every call validates all of its arguments first and
 * returns an error naming the argument and the rule before anything is written.
 *
 * Versioning: each struct below opens with `struct_size`, sizeof the struct as the caller's copy of this header
 * declares it. A later CODA adds fields only at a struct's end (e.g. the weights of a new norm) and still accepts
 * the sizes of earlier versions, giving the fields such a caller lacks their documented defaults; a size it does
 * not know (0: not set; larger: a newer header than the library) is CODA_ERROR_INVALID_ARGUMENT naming the field.
 * Set it with the CODA_BLOCK_*_INIT initialisers in C, e.g. `coda_block_weights w = CODA_BLOCK_WEIGHTS_INIT;` (the
 * other fields zero), or coda::block_struct<T>() in C++ (block.hpp), then fill the rest.
 * This header is version 2, which appended the QK-norm fields (config.qk_eps, weights.q_gamma / k_gamma,
 * grads.q_gamma / k_gamma, saved.z). Version 1's sizes (each struct up to, not including, its first version-2 field:
 * 40 bytes for the config, 536 for the others on LP64) are accepted: their QK-norm is off. A tensor field a caller
 * does not use stays unset (zero, data NULL); a set one that the configuration does not use is refused.
 */
#ifndef CODA_BLOCK_H_
#define CODA_BLOCK_H_

#include <coda/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Shapes and constants of a block. */
typedef struct coda_block_config {
  size_t struct_size;        /**< sizeof(coda_block_config): CODA_BLOCK_CONFIG_INIT */
  int64_t hidden_size;       /**< d (multiple of 8) */
  int64_t intermediate_size; /**< F (multiple of 8) */
  int32_t n_q_heads;         /**< hq */
  int32_t n_kv_heads;        /**< hkv (divides hq: GQA; equal: MHA) */
  int32_t head_dim;          /**< hd: 64 or 128 */
  float eps;                 /**< RMSNorm epsilon of both norms (> 0) */
  /* version 2 */
  float qk_eps; /**< 0 (default): no QK-norm. > 0: layer i+1's attention normalises each q and k head (Qwen3's
                     q_norm / k_norm, this epsilon; MATH.md linear_rowscale_qk_norm_rope): weights.q_gamma/k_gamma,
                     grads.q_gamma/k_gamma and saved.z are then required. Finite, >= 0. */
  uint32_t reserved; /**< 0. Spells out the tail padding, so that a later version's field lands past it and its
                          struct_size differs from this version's. */
} coda_block_config;

/** The block's weights (nn.Linear [out, in] layout). */
typedef struct coda_block_weights {
  size_t struct_size; /**< sizeof(coda_block_weights): CODA_BLOCK_WEIGHTS_INIT */
  coda_tensor w_o;    /**< [d, hq hd] out-projection of layer i */
  coda_tensor gamma1; /**< [d] post-attention (MLP) norm of layer i */
  coda_tensor w_gu;   /**< [2F, d] gate/up of layer i, interleaved */
  coda_tensor w_down; /**< [d, F] down-projection of layer i */
  coda_tensor gamma2; /**< [d] input (attention) norm of layer i+1 */
  coda_tensor w_qkv;  /**< [(hq + 2 hkv) hd, d] q/k/v of layer i+1, q/k rows RoPE-paired */
  /* version 2 */
  coda_tensor q_gamma; /**< with QK-norm: [hd] fp32 q_norm weight of layer i+1 in the paired column layout
                            (coda_pair_rope_rows of the [hd, 1] weight), 8-byte aligned; else unset */
  coda_tensor k_gamma; /**< with QK-norm: [hd] fp32 k_norm weight, as q_gamma; else unset */
} coda_block_weights;

/** Gradients of the weights: same shapes; w_* fp32 or the weights' dtype, gamma* and q/k_gamma fp32. Overwritten. */
typedef struct coda_block_grads {
  size_t struct_size; /**< sizeof(coda_block_grads): CODA_BLOCK_GRADS_INIT */
  coda_tensor w_o, gamma1, w_gu, w_down, gamma2, w_qkv;
  /* version 2 */
  coda_tensor q_gamma, k_gamma; /**< with QK-norm: [hd] fp32 each; else unset */
} coda_block_grads;

/**
 * Tensors the forward writes and the backward reads (allocate them per block and keep them until its backward).
 * x2 and qkv are also the forward's outputs (residual stream and attention input of layer i+1).
 */
typedef struct coda_block_saved {
  size_t struct_size; /**< sizeof(coda_block_saved): CODA_BLOCK_SAVED_INIT */
  coda_tensor x1;    /**< [M, d] residual stream after layer i's attention; may be x0 itself (in place) */
  coda_tensor rstd1; /**< [M] fp32 */
  coda_tensor z1;    /**< [M, 2F] gate/up pre-activation (interleaved); the backward overwrites it (with dz1) */
  coda_tensor x2;    /**< [M, d] residual stream after layer i's MLP */
  coda_tensor rstd2; /**< [M] fp32 */
  coda_tensor qkv;   /**< [M, (hq + 2 hkv) hd] rotated q/k/v of layer i+1 */
  /* version 2 */
  coda_tensor z; /**< with QK-norm: [M, (hq + 2 hkv) hd] the q/k/v projection before the per-head norm and RoPE (read
                      by the backward); else unset */
} coda_block_saved;

/** Initialisers (C99 designated, so -Wmissing-field-initializers stays quiet): struct_size set, every other field
 *  zero. C++: coda::block_struct<T>() (block.hpp). */
#define CODA_BLOCK_CONFIG_INIT {.struct_size = sizeof(coda_block_config)}
#define CODA_BLOCK_WEIGHTS_INIT {.struct_size = sizeof(coda_block_weights)}
#define CODA_BLOCK_GRADS_INIT {.struct_size = sizeof(coda_block_grads)}
#define CODA_BLOCK_SAVED_INIT {.struct_size = sizeof(coda_block_saved)}

/**
 * Forward of one block (see above).
 * \param y0 [M, hq hd] attention output of layer i. \param x0 [M, d] residual stream entering the block.
 * \param positions [M] int32 token positions. \param inv_freq [hd/2] fp32 RoPE inverse frequencies.
 * \param saved the outputs (all written).
 * Workspace: coda_block_forward_workspace_size(config, M) bytes (h [M,d], y1 [M,F] and the ops' workspaces; 0 for
 * a NULL config, an unknown config->struct_size, M < 0 or non-positive sizes).
 */
CODA_API coda_status coda_block_forward(const coda_block_config* config, const coda_block_weights* weights,
                                        const coda_tensor* y0, const coda_tensor* x0, const coda_tensor* positions,
                                        const coda_tensor* inv_freq, coda_block_saved* saved, void* workspace,
                                        size_t workspace_bytes, void* stream);
CODA_API size_t coda_block_forward_workspace_size(const coda_block_config* config, int64_t M);

/**
 * Backward of one block.
 * \param y0, positions, inv_freq as given to the forward. \param saved as the forward left it (z1 is overwritten).
 * \param dqkv [M, (hq + 2 hkv) hd] gradient of qkv from attention's backward; overwritten (it becomes dz of the
 *        q/k/v projection).
 * \param dx2 NULL or [M, d]: gradient of x2 from the layers after this block (NULL: zero).
 * \param dy0_out [M, hq hd] gradient of y0 (for attention's backward). \param dx0_out [M, d] gradient of x0; may be
 *        dx2 itself (in place).
 * \param grads the weight gradients (all written, not accumulated).
 * Workspace: coda_block_backward_workspace_size(config, M) bytes (a [M,d], y1 [M,F], zdz x2 and the ops'; 0 as
 * for the forward's).
 */
CODA_API coda_status coda_block_backward(const coda_block_config* config, const coda_block_weights* weights,
                                         const coda_tensor* y0, const coda_tensor* positions,
                                         const coda_tensor* inv_freq, const coda_block_saved* saved,
                                         coda_tensor* dqkv, const coda_tensor* dx2, coda_tensor* dy0_out,
                                         coda_tensor* dx0_out, coda_block_grads* grads, void* workspace,
                                         size_t workspace_bytes, void* stream);
CODA_API size_t coda_block_backward_workspace_size(const coda_block_config* config, int64_t M);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // CODA_BLOCK_H_
