"""nn.Modules over coda.ops. Parameters are kept in CODA's layouts (gate/up interleaved, q/k rows RoPE-paired); their
state_dict is in Hugging Face layout and names (gate_proj.weight, up_proj.weight, q_proj.weight, ...): the
permutation happens in state_dict / load_state_dict hooks, so ordinary HF weights load and save unchanged.

Parameters may be fp32 masters with bf16 activations: each forward casts the weights to the input's dtype
(autograd casts the gradients back).

Each module's forward reads only its own parameters, so torch.distributed.fsdp.fully_shard (FSDP2), DDP and
activation checkpointing wrap them as they wrap any module. The state_dict hooks also convert FSDP2's sharded
DTensors shard by shard, and load full (plain) state dicts into sharded modules.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from . import layout, ops


def _w(p, x):
    return p if p.dtype == x.dtype else p.to(x.dtype)


def _randn(shape, std, dtype, device):
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device).normal_(0.0, std))


class RMSNormLinear(nn.Module):
    """y = rmsnorm(x; norm_weight, eps) W^T (linear_rowscale; backward linear_residual_rmsnorm_bwd).
    x [..., in_features] -> y [..., out_features]. state_dict: `norm_weight` [in], `weight` [out, in]."""

    def __init__(self, in_features, out_features, eps=1e-6, *, dtype=None, device=None):
        super().__init__()
        self.eps = eps
        self.norm_weight = nn.Parameter(torch.ones(in_features, dtype=dtype, device=device))
        self.weight = _randn((out_features, in_features), 1 / math.sqrt(in_features), dtype, device)
        _full_to_shard_hook(self)

    def forward(self, x, cache=None):
        return ops.rmsnorm_linear(x, _w(self.norm_weight, x), _w(self.weight, x), self.eps, cache=cache)


def _plain(t):
    return type(t) in (torch.Tensor, nn.Parameter)


def _rows_local(w):
    """A DTensor (FSDP2's sharded parameter) -> one whose shards hold whole rows, so that the row permutations and
    splits of coda.layout run on each rank's own shard. FSDP2 shards dim 0, which cuts across the q/k/v and gate/up
    row groups; moving the shard to dim 1 is an all-to-all of one shard (on NCCL; gloo, which lacks all-to-all, falls
    back to an all-gather), not a gather of the whole weight onto each rank. A shard offloaded to the CPU
    (CPUOffloadPolicy) goes to the mesh's device first: the collective runs there."""
    if _plain(w):
        return w
    from torch.distributed.tensor import DTensor, Shard
    if not isinstance(w, DTensor) or not any(p.is_shard(0) for p in w.placements):
        return w
    if w.device.type != w.device_mesh.device_type:
        w = w.to(w.device_mesh.device_type)
    return w.redistribute(w.device_mesh, [Shard(1) if p.is_shard(0) else p for p in w.placements])


def _like_param(w, param):
    """A converted weight -> the placement and device of the parameter it loads into: a DTensor is redistributed
    (all-to-all back to FSDP2's dim-0 shards); a plain, full tensor (e.g. a Hugging Face state dict loaded on every
    rank) keeps only this rank's shard, with no communication."""
    if _plain(param):
        return w
    from torch.distributed.tensor import DTensor, distribute_tensor
    if not isinstance(param, DTensor):
        return w
    if isinstance(w, DTensor):
        w = w.redistribute(param.device_mesh, param.placements)
    else:
        w = distribute_tensor(w.to(param.device_mesh.device_type), param.device_mesh, param.placements,
                              src_data_rank=None)
    return w if w.device == param.device else w.to(param.device)


def _full_to_shard_hook(module):
    """load_state_dict of full (plain) tensors, e.g. a Hugging Face checkpoint read on every rank, into a module
    whose parameters FSDP2 has sharded: each rank keeps its shard (no communication). The CODA-layout weights are
    converted by their own hooks; this covers the others."""

    def load(state, prefix, meta, strict, missing, unexpected, errors):
        for name, p in module.named_parameters(remove_duplicate=False):
            k = prefix + name
            if k in state and not _plain(p) and _plain(state[k]):
                state[k] = _like_param(state[k], p)

    module._register_load_state_dict_pre_hook(load)


def _hf_gate_up_hooks(module, attr):
    """state_dict: `attr` (interleaved [2F, d]) <-> gate_proj.weight, up_proj.weight (HF). Works on plain tensors
    and on FSDP2's DTensors (see _rows_local)."""

    def save(mod, state, prefix, meta):
        w = state.pop(prefix + attr, None)
        if w is not None:
            gate, up = layout.deinterleave_gate_up(_rows_local(w))
            state[prefix + "gate_proj.weight"] = gate.contiguous()
            state[prefix + "up_proj.weight"] = up.contiguous()

    def load(state, prefix, meta, strict, missing, unexpected, errors):
        g, u = prefix + "gate_proj.weight", prefix + "up_proj.weight"
        if g in state and u in state:
            w = layout.interleave_gate_up(_rows_local(state.pop(g)), _rows_local(state.pop(u)))
            state[prefix + attr] = _like_param(w, getattr(module, attr))

    module.register_state_dict_post_hook(save)
    module._register_load_state_dict_pre_hook(load)


def _hf_qkv_hooks(module, attr, n_q_heads, n_kv_heads, head_dim, key_prefix=""):
    """state_dict: `attr` (CODA W_qkv) <-> {key_prefix}q_proj.weight, k_proj.weight, v_proj.weight (HF
    rotate-half). Works on plain tensors and on FSDP2's DTensors (see _rows_local)."""

    def save(mod, state, prefix, meta):
        w = state.pop(prefix + attr, None)
        if w is not None:
            for name, t in zip(("q", "k", "v"),
                               layout.split_qkv_weight(_rows_local(w), n_q_heads, n_kv_heads, head_dim)):
                state[f"{prefix}{key_prefix}{name}_proj.weight"] = t.contiguous()

    def load(state, prefix, meta, strict, missing, unexpected, errors):
        keys = [f"{prefix}{key_prefix}{n}_proj.weight" for n in ("q", "k", "v")]
        if all(k in state for k in keys):
            w = layout.qkv_weight(*(_rows_local(state.pop(k)) for k in keys), head_dim)
            state[prefix + attr] = _like_param(w, getattr(module, attr))

    module.register_state_dict_post_hook(save)
    module._register_load_state_dict_pre_hook(load)


class SwiGLUMLP(nn.Module):
    """x_out = x + down(silu(gate(n)) * up(n)), n = rmsnorm(x; norm_weight) (linear_rowscale_swiglu +
    linear_residual_rmsnorm; backward linear_swiglu_bwd_zdz + linear_residual_rmsnorm_bwd), and the next norm's cache
    for the op after it.  forward(x, cache=None, next_gamma=None) -> (x_out, (h_next, rstd_next)).
    state_dict: `norm_weight`, `gate_proj.weight`, `up_proj.weight` [F, d], `down_proj.weight` [d, F]."""

    def __init__(self, hidden_size, intermediate_size, eps=1e-6, *, dtype=None, device=None):
        super().__init__()
        self.eps = eps
        self.norm_weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype, device=device))
        self.w_gu = _randn((2 * intermediate_size, hidden_size), 1 / math.sqrt(hidden_size), dtype, device)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False, dtype=dtype, device=device)
        _hf_gate_up_hooks(self, "w_gu")
        _full_to_shard_hook(self)

    def forward(self, x, cache=None, next_gamma=None):
        return ops.swiglu_mlp(x, _w(self.norm_weight, x), _w(self.w_gu, x), _w(self.down_proj.weight, x),
                              self.eps, cache=cache, next_gamma=None if next_gamma is None else _w(next_gamma, x))


class RMSNormQKVRope(nn.Module):
    """qkv = RoPE(rmsnorm(x; norm_weight) W_qkv^T) (linear_rowscale_rope; backward rope_bwd_zdz +
    linear_residual_rmsnorm_bwd). forward(x, positions, inv_freq, cache=None) -> qkv [..., (hq + 2 hkv) hd], q/k
    dimensions in RoPE-pair order.
    state_dict: `norm_weight`, `q_proj.weight`, `k_proj.weight`, `v_proj.weight` (HF rotate-half layout)."""

    def __init__(self, hidden_size, n_q_heads, n_kv_heads, head_dim, eps=1e-6, *, dtype=None, device=None):
        super().__init__()
        self.eps, self.n_q_heads, self.n_kv_heads, self.head_dim = eps, n_q_heads, n_kv_heads, head_dim
        self.norm_weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype, device=device))
        self.w_qkv = _randn(((n_q_heads + 2 * n_kv_heads) * head_dim, hidden_size), 1 / math.sqrt(hidden_size),
                            dtype, device)
        _hf_qkv_hooks(self, "w_qkv", n_q_heads, n_kv_heads, head_dim)
        _full_to_shard_hook(self)

    def forward(self, x, positions, inv_freq, cache=None):
        return ops.rmsnorm_qkv_rope(x, _w(self.norm_weight, x), _w(self.w_qkv, x), positions, inv_freq,
                                     self.n_q_heads, self.n_kv_heads, self.head_dim, self.eps, cache=cache)


class RMSNormQKVQKNormRope(RMSNormQKVRope):
    """qkv = RoPE(qk_norm(rmsnorm(x; norm_weight) W_qkv^T)) (Qwen3's attention input: ops.rmsnorm_qkv_qk_norm_rope),
    where qk_norm RMS-normalises each q head with q_norm.weight and each k head with k_norm.weight (eps as the input
    norm's). forward as RMSNormQKVRope's. state_dict: RMSNormQKVRope's plus `q_norm.weight`, `k_norm.weight`
    [head_dim] in HF's rotate-half order (paired on each forward, a head_dim-sized gather)."""

    def __init__(self, hidden_size, n_q_heads, n_kv_heads, head_dim, eps=1e-6, *, dtype=None, device=None):
        super().__init__(hidden_size, n_q_heads, n_kv_heads, head_dim, eps, dtype=dtype, device=device)
        self.q_norm = _Norm(head_dim, dtype, device)
        self.k_norm = _Norm(head_dim, dtype, device)

    def forward(self, x, positions, inv_freq, cache=None):
        q_gamma, k_gamma = (layout.pair_rope_rows(_w(n.weight, x), self.head_dim)
                            for n in (self.q_norm, self.k_norm))
        return ops.rmsnorm_qkv_qk_norm_rope(x, _w(self.norm_weight, x), _w(self.w_qkv, x), q_gamma, k_gamma,
                                             positions, inv_freq, self.n_q_heads, self.n_kv_heads, self.head_dim,
                                             self.eps, cache=cache)


class LlamaBlock(nn.Module):
    """The CODA block (MATH.md "One block"): layer i's o-projection, MLP norm and SwiGLU MLP, then layer i+1's
    input norm and q/k/v with RoPE, as one autograd node (coda.ops.block).
    forward(y0 [..., hq hd], x0 [..., d], positions [...], inv_freq [hd/2]) -> (x2 [..., d], qkv).
    state_dict: `o_proj.weight`, `post_attention_layernorm.weight`, `gate_proj.weight`, `up_proj.weight`,
    `down_proj.weight`, `next_input_layernorm.weight`, `next_q_proj.weight`, `next_k_proj.weight`,
    `next_v_proj.weight` (HF layouts)."""

    def __init__(self, hidden_size, intermediate_size, n_q_heads, n_kv_heads, head_dim, eps=1e-6, *, dtype=None,
                 device=None):
        super().__init__()
        d, Fi = hidden_size, intermediate_size
        self.eps, self.n_q_heads, self.n_kv_heads, self.head_dim = eps, n_q_heads, n_kv_heads, head_dim
        self.o_proj = nn.Linear(n_q_heads * head_dim, d, bias=False, dtype=dtype, device=device)
        self.post_attention_layernorm = _Norm(d, dtype, device)
        self.w_gu = _randn((2 * Fi, d), 1 / math.sqrt(d), dtype, device)
        self.down_proj = nn.Linear(Fi, d, bias=False, dtype=dtype, device=device)
        self.next_input_layernorm = _Norm(d, dtype, device)
        self.next_w_qkv = _randn(((n_q_heads + 2 * n_kv_heads) * head_dim, d), 1 / math.sqrt(d), dtype, device)
        _hf_gate_up_hooks(self, "w_gu")
        _hf_qkv_hooks(self, "next_w_qkv", n_q_heads, n_kv_heads, head_dim, key_prefix="next_")
        _full_to_shard_hook(self)

    def forward(self, y0, x0, positions, inv_freq):
        return ops.block(y0, x0, _w(self.o_proj.weight, x0), _w(self.post_attention_layernorm.weight, x0),
                         _w(self.w_gu, x0), _w(self.down_proj.weight, x0), _w(self.next_input_layernorm.weight, x0),
                         _w(self.next_w_qkv, x0), positions, inv_freq, self.n_q_heads, self.n_kv_heads,
                         self.head_dim, self.eps)


class _Norm(nn.Module):
    """An RMSNorm weight holder (the normalisation itself is fused into the GEMM that follows)."""

    def __init__(self, d, dtype, device):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d, dtype=dtype, device=device))


class LinearCrossEntropyLoss(nn.Module):
    """Final RMSNorm + LM head + cross-entropy without logits in memory (coda.ops.linear_cross_entropy).
    forward(x [..., d], norm_weight [d], lm_head_weight [V, d], targets [...], cache=None) -> loss.
    Options as torch.nn.CrossEntropyLoss (ignore_index, reduction, label_smoothing) plus z_loss and softcap."""

    def __init__(self, eps=1e-6, *, ignore_index=-100, reduction="mean", label_smoothing=0.0, z_loss=0.0,
                 softcap=None, chunk_rows=0):
        super().__init__()
        self.eps, self.ignore_index, self.reduction = eps, ignore_index, reduction
        self.label_smoothing, self.z_loss, self.softcap, self.chunk_rows = label_smoothing, z_loss, softcap, chunk_rows

    def forward(self, x, norm_weight, lm_head_weight, targets, cache=None):
        return ops.linear_cross_entropy(x, _w(norm_weight, x), _w(lm_head_weight, x), targets, self.eps, cache=cache,
                                        ignore_index=self.ignore_index, reduction=self.reduction,
                                        label_smoothing=self.label_smoothing, z_loss=self.z_loss,
                                        softcap=self.softcap, chunk_rows=self.chunk_rows)
