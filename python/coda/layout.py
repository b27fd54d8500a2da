"""Weight layouts: Hugging Face / PyTorch order <-> CODA order (MATH.md "Layouts"). Pure row permutations,
differentiable (gradients map back to the original layout), usable on any device and dtype.

- RoPE pairs: HF (rotate-half) pairs dimension i with i + head_dim/2 inside each head; CODA wants the pair adjacent
  (rows 2i, 2i+1). Applied to the rows of W_q and W_k (not W_v); q.k products are unchanged because q and k get
  the same permutation.
- Gate/up: HF keeps W_gate and W_up ([F, d] each); CODA interleaves them into W_gu [2F, d] with rows
  (g0, u0, g1, u1, ...) so the SwiGLU pair of an output sits in one GEMM tile.
"""
from __future__ import annotations

import torch


def pair_rope_rows(w: torch.Tensor, head_dim: int) -> torch.Tensor:
    """[H head_dim, ...] rotate-half rows -> pairs adjacent: new row 2i <- old i, new row 2i+1 <- old i + hd/2. A 1-D
    w is a vector of rows: a [head_dim] QK-norm gamma (Qwen3's q_norm / k_norm weight) takes the same permutation."""
    _check_heads(w, head_dim)
    rest = w.shape[1:]
    return w.reshape(-1, 2, head_dim // 2, *rest).transpose(1, 2).reshape(w.shape)


def unpair_rope_rows(w: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Inverse of pair_rope_rows."""
    _check_heads(w, head_dim)
    rest = w.shape[1:]
    return w.reshape(-1, head_dim // 2, 2, *rest).transpose(1, 2).reshape(w.shape)


def interleave_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """W_gate [F, d], W_up [F, d] -> W_gu [2F, d], rows (g0, u0, g1, u1, ...)."""
    if gate.shape != up.shape:
        raise ValueError(f"coda.layout.interleave_gate_up: `gate` {tuple(gate.shape)} and `up` {tuple(up.shape)} "
                         "must have one shape")
    return torch.stack((gate, up), dim=1).reshape(2 * gate.shape[0], *gate.shape[1:])


def deinterleave_gate_up(w_gu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of interleave_gate_up: W_gu [2F, d] -> (W_gate, W_up), strided views of w_gu (call .contiguous()
    for dense copies)."""
    if w_gu.shape[0] % 2:
        raise ValueError(f"coda.layout.deinterleave_gate_up: `w_gu` must have an even number of rows, got "
                         f"{tuple(w_gu.shape)}")
    return w_gu[0::2], w_gu[1::2]


def qkv_weight(w_q, w_k, w_v, head_dim: int) -> torch.Tensor:
    """HF W_q, W_k, W_v -> CODA W_qkv = [pair(W_q); pair(W_k); W_v]."""
    return torch.cat((pair_rope_rows(w_q, head_dim), pair_rope_rows(w_k, head_dim), w_v), dim=0)


def split_qkv_weight(w_qkv, n_q_heads: int, n_kv_heads: int, head_dim: int):
    """Inverse of qkv_weight: -> (W_q, W_k, W_v) in HF layout."""
    rows = (n_q_heads + 2 * n_kv_heads) * head_dim
    if w_qkv.shape[0] != rows:
        raise ValueError(f"coda.layout.split_qkv_weight: `w_qkv` must have (n_q_heads + 2 n_kv_heads) head_dim = {rows} "
                         f"rows, got {tuple(w_qkv.shape)}")
    q, k, v = torch.split(w_qkv, [n_q_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim], dim=0)
    return unpair_rope_rows(q, head_dim), unpair_rope_rows(k, head_dim), v


def _check_heads(w, head_dim):
    if head_dim < 2 or head_dim % 2 or w.shape[0] % head_dim:
        raise ValueError(f"coda.layout: `head_dim` ({head_dim}) must be even and divide the rows of w "
                         f"({tuple(w.shape)})")
