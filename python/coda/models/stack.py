"""The LLaMA layer stack as CODA composes it (MATH.md "One block"), shared by coda.models.llama and
coda.patch_llama: embeddings -> first norm + q/k/v -> [attention -> CODA block]* -> last layer's MLP -> final norm
cache, then the LM head (loss without logits, or logits)."""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .. import ops


def compute_dtype(x, requested=None):
    """The dtype the kernels run in: `requested`, else torch.autocast's dtype when autocast is on for x's device and
    x is float32 (fp32 master weights + autocast, as HF's Trainer trains), else x's dtype."""
    if requested is not None:
        return requested
    dev = x.device.type
    if x.dtype == torch.float32 and torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return x.dtype


def cast(t, dtype):
    return t if t.dtype == dtype else t.to(dtype)


class LayerWeights(NamedTuple):
    """One decoder layer's weights in CODA layout (coda.layout), in the model's compute dtype."""
    gamma_in: torch.Tensor   # [d] input (attention) RMSNorm
    w_qkv: torch.Tensor      # [(hq + 2 hkv) hd, d], q/k rows RoPE-paired
    w_o: torch.Tensor        # [d, hq hd]
    gamma_post: torch.Tensor  # [d] post-attention (MLP) RMSNorm
    w_gu: torch.Tensor       # [2F, d] gate/up interleaved
    w_down: torch.Tensor     # [d, F]
    q_gamma: torch.Tensor | None = None  # [hd] per-head q RMSNorm (QK-norm: Qwen3), RoPE-paired; None: no QK-norm
    k_gamma: torch.Tensor | None = None  # [hd] the same for k


def attention(qkv, attention_mask, hq, hkv, hd, dropout):
    """Causal SDPA on CODA's qkv [B, S, (hq + 2 hkv) hd] -> [B, S, hq hd]. q and k carry their dimensions in
    RoPE-pair order, the same permutation for both, so q.k and the result are unchanged. attention_mask: None or a
    [B, S] padding mask (1 = token)."""
    B, S, _ = qkv.shape
    q, k, v = torch.split(qkv, [hq * hd, hkv * hd, hkv * hd], dim=-1)
    q = q.view(B, S, hq, hd).transpose(1, 2)
    k = k.view(B, S, hkv, hd).transpose(1, 2)
    v = v.view(B, S, hkv, hd).transpose(1, 2)
    if attention_mask is None:
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, enable_gqa=hq != hkv)
    else:
        # Causal and key padding; a query always sees itself, so padded rows stay finite (their labels are ignored).
        idx = torch.arange(S, device=qkv.device)
        causal = idx[None, :] <= idx[:, None]
        keys = attention_mask.to(torch.bool)[:, None, None, :] | torch.eye(S, dtype=torch.bool, device=qkv.device)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal & keys, dropout_p=dropout,
                                           enable_gqa=hq != hkv)
    return y.transpose(1, 2).reshape(B, S, hq * hd)


def qkv_projection(x, w, positions, inv_freq, hq, hkv, hd, eps, cache):
    """A layer's attention input from its residual stream x: rmsnorm_qkv_rope, or with QK-norm (w.q_gamma set)
    rmsnorm_qkv_qk_norm_rope. cache: (h, rstd) of x's norm with w.gamma_in."""
    if w.q_gamma is None:
        return ops.rmsnorm_qkv_rope(x, w.gamma_in, w.w_qkv, positions, inv_freq, hq, hkv, hd, eps, cache=cache)
    return ops.rmsnorm_qkv_qk_norm_rope(x, w.gamma_in, w.w_qkv, w.q_gamma, w.k_gamma, positions, inv_freq, hq, hkv,
                                         hd, eps, cache=cache)


# Whether run_layers takes the block (coda_block_forward / _backward with config.qk_eps, block.h version 2) for a next
# layer with QK-norm too (Qwen3), instead of linear_residual_rmsnorm + swiglu_mlp + rmsnorm_qkv_qk_norm_rope. Both
# run the same fused kernels; the block saves h1, h2 and y1 and one autograd node per layer. On by default since its
# GPU tests passed (an H100, 2026-12-05: Block.ForwardBackwardQkNorm, test_gpu_block_qk_norm, test_gpu_patch_qwen3
# [block]) and `coda.train --model qwen3` ran 1.23-1.30x the per-layer path's tokens/s on the same card
# (bench/results/train_qwen3_h200/README.md). CODA_QK_NORM_BLOCK=0 (or false, off, no) turns it off (read at
# import).
QK_NORM_BLOCK = os.environ.get("CODA_QK_NORM_BLOCK", "1").strip().lower() not in ("0", "false", "off", "no")


def run_layers(x, positions, inv_freq, layers, gamma_final, attention_mask, hq, hkv, hd, eps, dropout=0.0):
    """x [B, S, d] embeddings -> (x_out [B, S, d], (h, rstd) of the final norm). positions [B, S]; inv_freq [hd/2]
    fp32; layers: LayerWeights per layer."""
    # Once per step: int32 and contiguous, so each layer's op takes it as is (no cast or copy kernel per layer).
    positions = positions.to(torch.int32).contiguous()
    first = layers[0]
    qkv = qkv_projection(x, first, positions, inv_freq, hq, hkv, hd, eps, ops.rmsnorm_prepare(x, first.gamma_in, eps))
    for i, layer in enumerate(layers):
        y0 = attention(qkv, attention_mask, hq, hkv, hd, dropout)
        nxt = layers[i + 1] if i + 1 < len(layers) else None
        if nxt is not None and (nxt.q_gamma is None or QK_NORM_BLOCK):
            x, qkv = ops.block(y0, x, layer.w_o, layer.gamma_post, layer.w_gu, layer.w_down, nxt.gamma_in,
                               nxt.w_qkv, positions, inv_freq, hq, hkv, hd, eps, q_gamma=nxt.q_gamma,
                               k_gamma=nxt.k_gamma)
            continue
        # The last layer (or, with QK_NORM_BLOCK off, a next layer with QK-norm): linear_residual_rmsnorm and
        # the MLP, the next norm fused into the down-projection, then the next layer's projection from its cache.
        x1, h1, rstd1 = ops.linear_residual_rmsnorm(y0, layer.w_o, x, layer.gamma_post, eps)
        x, norm_cache = ops.swiglu_mlp(x1, layer.gamma_post, layer.w_gu, layer.w_down, eps, cache=(h1, rstd1),
                                       next_gamma=gamma_final if nxt is None else nxt.gamma_in)
        if nxt is not None:
            qkv = qkv_projection(x, nxt, positions, inv_freq, hq, hkv, hd, eps, norm_cache)
    return x, norm_cache


def wrapped(layers, layer_type):
    """True when a layer is not a plain `layer_type` or has forward hooks (torch.distributed.fsdp.fully_shard per
    layer, checkpoint_wrapper, hooks): then each layer must be called through its module, on its own weights
    (layer_forward), instead of run_layers' blocks that read the next layer's weights."""
    return any(type(layer) is not layer_type or layer._forward_hooks or layer._forward_pre_hooks for layer in layers)


def layer_forward(x, positions, inv_freq, w, attention_mask, hq, hkv, hd, eps, dropout=0.0):
    """One decoder layer on its own weights (LayerWeights w): x [B, S, d] -> x_out [B, S, d]; positions [B, S] int32.
    The path for layers called one by one (FSDP2 per layer, checkpoint wrappers, hooks, HF's gradient
    checkpointing): FSDP2 gathers a layer's weights around that call only, so nothing may read the next layer's.
    Costs one rmsnorm_prepare per layer (a read of the activations) over run_layers' cross-layer blocks."""
    qkv = qkv_projection(x, w, positions, inv_freq, hq, hkv, hd, eps, ops.rmsnorm_prepare(x, w.gamma_in, eps))
    y0 = attention(qkv, attention_mask, hq, hkv, hd, dropout)
    x1, h1, rstd1 = ops.linear_residual_rmsnorm(y0, w.w_o, x, w.gamma_post, eps)
    return ops.swiglu_mlp(x1, w.gamma_post, w.w_gu, w.w_down, eps, cache=(h1, rstd1))[0]


def causal_lm_head(x, norm_cache, gamma_final, w_head, eps, labels=None, num_items_in_batch=None, logits_to_keep=0):
    """-> (loss, logits). With labels: HF's shifted next-token loss (labels -100 ignored; mean over the other tokens,
    or sum / num_items_in_batch), logits None (never materialised). Without: logits [B, S', V] for the last
    logits_to_keep positions (0: all) or the given indices."""
    if labels is not None:
        targets = F.pad(labels, (0, 1), value=-100)[..., 1:]
        if num_items_in_batch is None:
            return ops.linear_cross_entropy(x, gamma_final, w_head, targets, eps, cache=norm_cache), None
        loss = ops.linear_cross_entropy(x, gamma_final, w_head, targets, eps, cache=norm_cache, reduction="sum")
        return loss / num_items_in_batch, None
    h, rstd = norm_cache
    if isinstance(logits_to_keep, int):
        keep = slice(-logits_to_keep, None) if logits_to_keep > 0 else slice(None)
    else:
        keep = logits_to_keep
    return None, ops.rmsnorm_linear(x[:, keep], gamma_final, w_head, eps, cache=(h[:, keep], rstd[:, keep]))
