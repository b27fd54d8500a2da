"""The q/k/v projection family: RMSNorm + the q/k/v GEMM + RoPE (linear_rowscale_rope, backward rope_bwd_zdz), and
Qwen3's per-head QK-norm before the RoPE (linear_rowscale_qk_norm_rope, backward qk_norm_rope_bwd_zdz).

Each op here: its public function (coda.ops), its custom op with fake kernel and autograd (_library), its CUDA call
(`<op>_cuda`, read as _kernels.<op>) and its float64 twin (`<op>_f64`, read as _reference.<op>); MATH.md has the
equations.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .. import _C
from .. import _check as check
from .. import _kernels as K
from .. import _reference as R
from .._kernels import kernel
from .._library import custom_op, impl, no_grad_outputs, register_autograd, stat
from .._reference import reference
from ._common import CACHE, PREPARE, library_names, norm_args, norm_cache, rows, same
from ._norm import norm_linear_bwd

_d = _C.desc

__all__ = ["rmsnorm_qkv_rope", "rmsnorm_qkv_qk_norm_rope"]


# ---- public ops ------------------------------------------------------------------------------------------------------

def _qkv_rope_args(op, x, gamma, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, eps):
    """The checks of a q/k/v projection with RoPE: the norm's and the GEMM's arguments, the heads, positions (one
    integer per token) and inv_freq [head_dim / 2]."""
    norm_args(op, x, gamma, w_qkv, eps, ("x", "gamma", "w_qkv"))
    check.heads(op, w_qkv.shape[0], n_q_heads, n_kv_heads, head_dim)
    check.tensor(op, "positions", positions, dtype=(torch.int32, torch.int64))
    check.tensor(op, "inv_freq", inv_freq, rank=1, floating=True)
    check.same_device(op, x=x, positions=positions, inv_freq=inv_freq)
    check.size(op, "inv_freq", inv_freq, 0, head_dim // 2, "head_dim / 2")
    if positions.shape != x.shape[:-1]:
        raise ValueError(f"coda.{op}: `positions` must have shape {tuple(x.shape[:-1])} (one per token), got "
                         f"{tuple(positions.shape)}")


@library_names(rmsnorm_prepare=PREPARE, linear_rowscale_rope={
    **CACHE, **same("w_qkv", "positions", "inv_freq", "n_q_heads", "n_kv_heads", "head_dim")})
def rmsnorm_qkv_rope(x, gamma, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, eps=1e-6, *,
                     cache=None):
    """qkv = RoPE(rmsnorm(x) w_qkv^T) (linear_rowscale_rope), q and k rotated by theta = positions * inv_freq, v
    passed through.

    x [..., d]; gamma [d]; w_qkv [(n_q_heads + 2 n_kv_heads) head_dim, d] with q/k rows RoPE-paired per head
    (coda.layout.pair_rope_rows); positions [...] integer token positions (0 <= pos < 2^24; any order: packed
    sequences work; int64 values are converted to int32 and not range-checked on the device, which would need a
    host synchronisation; the angle accuracy is documented up to 2^24); inv_freq [head_dim/2] fp32 (scaled RoPE variants
    are the caller's choice); head_dim 64 or 128.
    Returns qkv [..., (n_q_heads + 2 n_kv_heads) head_dim], columns [q heads | k heads | v heads], each head with
    its rotary pairs adjacent (dimension 2i, 2i+1 is pair i). Backward: rope_bwd_zdz (RoPE^T and the row dot) +
    linear_residual_rmsnorm_bwd.
    """
    op = "rmsnorm_qkv_rope"
    _qkv_rope_args(op, x, gamma, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, eps)
    x2 = rows(x)
    h, rstd = norm_cache(op, x, x2, gamma, float(eps), cache)
    pos = positions.reshape(-1).to(torch.int32)
    inv = inv_freq.to(torch.float32) if x.is_cuda else inv_freq
    qkv = rmsnorm_qkv_rope_op(x2, gamma, w_qkv, h, rstd, pos, inv, int(n_q_heads), int(n_kv_heads),
                              int(head_dim))
    return qkv.reshape(*x.shape[:-1], w_qkv.shape[0])


@library_names(rmsnorm_prepare=PREPARE, linear_rowscale_qk_norm_rope={
    **CACHE, **same("w_qkv", "q_gamma", "k_gamma", "positions", "inv_freq", "n_q_heads", "n_kv_heads", "head_dim",
                    "qk_eps")})
def rmsnorm_qkv_qk_norm_rope(x, gamma, w_qkv, q_gamma, k_gamma, positions, inv_freq, n_q_heads, n_kv_heads,
                             head_dim, eps=1e-6, qk_eps=None, *, cache=None):
    """qkv = RoPE(qk_norm(rmsnorm(x) w_qkv^T)) (Qwen3 style; MATH.md "linear_rowscale_qk_norm_rope"),
    where qk_norm RMS-normalises each q head with q_gamma and each k head with k_gamma over its head_dim columns
    (epsilon qk_eps, default eps); v passes through.

    Arguments as rmsnorm_qkv_rope, plus q_gamma, k_gamma [head_dim] in the paired layout (coda.layout.pair_rope_rows
    applied to HF's q_norm / k_norm weight; the per-head mean does not depend on the order).
    Returns qkv as rmsnorm_qkv_rope does. Forward: one fused GEMM (coda_linear_rowscale_qk_norm_rope: the input
    norm's row scale, the per-head norm, gamma and RoPE in its epilogue), which also stores the pre-norm z [tokens,
    W] for the backward (saved instead of qkv). Backward: the QK-norm + RoPE backward from z (MATH.md; one kernel,
    coda_qk_norm_rope_bwd_zdz: dz, zdz and the q/k gamma gradients, deterministic), then
    coda_linear_residual_rmsnorm_bwd.
    """
    op = "rmsnorm_qkv_qk_norm_rope"
    _qkv_rope_args(op, x, gamma, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, eps)
    for name, t in (("q_gamma", q_gamma), ("k_gamma", k_gamma)):
        check.tensor(op, name, t, rank=1, floating=True)
        check.size(op, name, t, 0, head_dim, "head_dim")
    check.same_device(op, x=x, q_gamma=q_gamma, k_gamma=k_gamma)
    qk_eps = eps if qk_eps is None else qk_eps
    check.positive(op, "qk_eps", qk_eps)
    x2 = rows(x)
    h, rstd = norm_cache(op, x, x2, gamma, float(eps), cache)
    pos = positions.reshape(-1).to(torch.int32)
    inv = inv_freq.to(torch.float32) if x.is_cuda else inv_freq
    qkv, _ = rmsnorm_qkv_qk_norm_rope_op(x2, gamma, w_qkv, h, rstd, q_gamma, k_gamma, pos, inv, int(n_q_heads),
                                         int(n_kv_heads), int(head_dim), float(qk_eps))
    return qkv.reshape(*x.shape[:-1], w_qkv.shape[0])


# ---- custom ops and autograd -----------------------------------------------------------------------------------------

@custom_op("coda::rope_bwd_zdz", mutates_args=())
def rope_bwd_zdz_op(qkv: Tensor, dqkv: Tensor, positions: Tensor, inv_freq: Tensor, n_q_heads: int, n_kv_heads: int,
                    head_dim: int, hidden_size: int) -> tuple[Tensor, Tensor]:
    return impl(qkv).rope_bwd_zdz(qkv, dqkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, hidden_size)


@rope_bwd_zdz_op.register_fake
def _(qkv, dqkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, hidden_size):
    return dqkv.new_empty(dqkv.shape), stat((qkv.shape[0],), qkv)


@custom_op("coda::rmsnorm_qkv_rope", mutates_args=())
def rmsnorm_qkv_rope_op(x: Tensor, gamma: Tensor, w_qkv: Tensor, h: Tensor, rstd: Tensor, positions: Tensor,
                        inv_freq: Tensor, n_q_heads: int, n_kv_heads: int, head_dim: int) -> Tensor:
    return impl(h).linear_rowscale_rope(h, w_qkv, rstd, positions, inv_freq, n_q_heads, n_kv_heads, head_dim)


@rmsnorm_qkv_rope_op.register_fake
def _(x, gamma, w_qkv, h, rstd, positions, inv_freq, n_q_heads, n_kv_heads, head_dim):
    return h.new_empty((h.shape[0], w_qkv.shape[0]))


def _qkv_rope_ctx(ctx, inputs, output):
    x, gamma, w_qkv, _, rstd, positions, inv_freq, hq, hkv, hd = inputs
    ctx.save_for_backward(x, gamma, w_qkv, rstd, positions, inv_freq, output)
    ctx.heads = (hq, hkv, hd)


def _qkv_rope_bwd(ctx, dqkv):
    x, gamma, w_qkv, rstd, positions, inv_freq, qkv = ctx.saved_tensors
    dz, zdz = rope_bwd_zdz_op(qkv, dqkv.contiguous(), positions, inv_freq, *ctx.heads, x.shape[1])
    dx, dgamma, dw = norm_linear_bwd(dz, zdz, x, gamma, w_qkv, rstd)
    return dx, dgamma, dw, None, None, None, None, None, None, None


register_autograd(rmsnorm_qkv_rope_op, _qkv_rope_bwd, _qkv_rope_ctx)


@custom_op("coda::rmsnorm_qkv_qk_norm_rope", mutates_args=())
def rmsnorm_qkv_qk_norm_rope_op(x: Tensor, gamma: Tensor, w_qkv: Tensor, h: Tensor, rstd: Tensor, q_gamma: Tensor,
                                k_gamma: Tensor, positions: Tensor, inv_freq: Tensor, n_q_heads: int, n_kv_heads: int,
                                head_dim: int, qk_eps: float) -> tuple[Tensor, Tensor]:
    return impl(h).linear_rowscale_qk_norm_rope(h, w_qkv, rstd, q_gamma, k_gamma, positions, inv_freq, n_q_heads,
                                                n_kv_heads, head_dim, qk_eps)


@rmsnorm_qkv_qk_norm_rope_op.register_fake
def _(x, gamma, w_qkv, h, rstd, q_gamma, k_gamma, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, qk_eps):
    return h.new_empty((h.shape[0], w_qkv.shape[0])), h.new_empty((h.shape[0], w_qkv.shape[0]))


@custom_op("coda::qk_norm_rope_bwd_zdz", mutates_args=())
def qk_norm_rope_bwd_zdz_op(z: Tensor, dqkv: Tensor, q_gamma: Tensor, k_gamma: Tensor, positions: Tensor,
                            inv_freq: Tensor, n_q_heads: int, n_kv_heads: int, head_dim: int, qk_eps: float,
                            hidden_size: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return impl(z).qk_norm_rope_bwd_zdz(z, dqkv, q_gamma, k_gamma, positions, inv_freq, n_q_heads, n_kv_heads,
                                        head_dim, qk_eps, hidden_size)


@qk_norm_rope_bwd_zdz_op.register_fake
def _(z, dqkv, q_gamma, k_gamma, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, qk_eps, hidden_size):
    return (dqkv.new_empty(dqkv.shape), stat((z.shape[0],), z), stat((head_dim,), z), stat((head_dim,), z))


def _qkv_qk_norm_rope_ctx(ctx, inputs, output):
    x, gamma, w_qkv, _, rstd, q_gamma, k_gamma, positions, inv_freq, hq, hkv, hd, qk_eps = inputs
    ctx.save_for_backward(x, gamma, w_qkv, rstd, q_gamma, k_gamma, positions, inv_freq, output[1])
    ctx.heads = (hq, hkv, hd)
    ctx.qk_eps = qk_eps
    no_grad_outputs(ctx, output[1])


def _qkv_qk_norm_rope_bwd(ctx, dqkv, dz_unused):
    x, gamma, w_qkv, rstd, q_gamma, k_gamma, positions, inv_freq, z = ctx.saved_tensors
    if dqkv is None:
        return (None,) * 13
    dz, zdz, dq_gamma, dk_gamma = qk_norm_rope_bwd_zdz_op(z, dqkv.contiguous(), q_gamma, k_gamma, positions, inv_freq,
                                                          *ctx.heads, ctx.qk_eps, x.shape[1])
    dx, dgamma, dw = norm_linear_bwd(dz, zdz, x, gamma, w_qkv, rstd)
    return (dx, dgamma, dw, None, None, dq_gamma.to(q_gamma.dtype), dk_gamma.to(k_gamma.dtype), None, None, None,
            None, None, None)


register_autograd(rmsnorm_qkv_qk_norm_rope_op, _qkv_qk_norm_rope_bwd, _qkv_qk_norm_rope_ctx)


# ---- CUDA calls and float64 twins ------------------------------------------------------------------------------------

@kernel
def linear_rowscale_rope_cuda(h, w_qkv, rstd, positions, inv_freq, n_q_heads, n_kv_heads, head_dim):
    """qkv = RoPE(diag(rstd) h w_qkv^T), q/k pairs adjacent."""
    M, N = h.shape[0], w_qkv.shape[0]
    positions, inv_freq = K.dense(positions), K.dense(inv_freq)
    qkv = torch.empty((M, N), dtype=h.dtype, device=h.device)
    ws = K.workspace("linear_rowscale_rope", h.device, M, N)
    _C.call("linear_rowscale_rope", _d(h), _d(w_qkv), _d(rstd), _d(positions), _d(inv_freq), n_q_heads,
            n_kv_heads, head_dim, _d(qkv), ws.data_ptr(), ws.numel(), _C.stream(h.device))
    return qkv


@reference
def linear_rowscale_rope_f64(h, w_qkv, rstd, positions, inv_freq, n_q_heads, n_kv_heads, head_dim):
    z = R.rowscale(h, w_qkv, rstd)
    return R.rotate(z, positions, inv_freq, n_q_heads + n_kv_heads, head_dim, 1.0).to(h.dtype)


@kernel
def rope_bwd_zdz_cuda(qkv, dqkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, hidden_size):
    """dz = R(-theta) dqkv, zdz = (1/d) sum qkv dqkv. -> (dz, zdz)."""
    positions, inv_freq = K.dense(positions), K.dense(inv_freq)
    dz = torch.empty_like(dqkv, memory_format=torch.contiguous_format)
    zdz = K.f32((qkv.shape[0],), qkv)
    _C.call("rope_bwd_zdz", _d(qkv), _d(dqkv), _d(positions), _d(inv_freq), n_q_heads, n_kv_heads, head_dim,
            hidden_size, _d(dz), _d(zdz), _C.stream(qkv.device))
    return dz, zdz


@reference
def rope_bwd_zdz_f64(qkv, dqkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, hidden_size):
    dq64 = R.f64(dqkv)
    dz = R.rotate(dq64, positions, inv_freq, n_q_heads + n_kv_heads, head_dim, -1.0)
    zdz = (R.f64(qkv) * dq64).sum(-1) / hidden_size
    return dz.to(dqkv.dtype), R.stat_like(zdz, qkv)


@kernel
def linear_rowscale_qk_norm_rope_cuda(h, w_qkv, rstd, q_gamma, k_gamma, positions, inv_freq, n_q_heads, n_kv_heads,
                                      head_dim, qk_eps, store_z=True):
    """qkv = RoPE(qk_norm(diag(rstd) h w_qkv^T)) and z = diag(rstd) h w_qkv^T. -> (qkv, z); z is
    None with store_z=False (the kernel skips its store: forward only)."""
    M, N = h.shape[0], w_qkv.shape[0]
    positions, inv_freq = K.dense(positions), K.dense(inv_freq)
    q_gamma, k_gamma = K.float_pairs(q_gamma), K.float_pairs(k_gamma)
    qkv = torch.empty((M, N), dtype=h.dtype, device=h.device)
    z = torch.empty((M, N), dtype=h.dtype, device=h.device) if store_z else None
    _C.call("linear_rowscale_qk_norm_rope", _d(h), _d(w_qkv), _d(rstd), _d(q_gamma), _d(k_gamma), _d(positions),
            _d(inv_freq), n_q_heads, n_kv_heads, head_dim, qk_eps, _d(qkv), _d(z), _C.stream(h.device))
    return qkv, z


@reference
def qk_norm_rope_f64(z, positions, inv_freq, q_gamma, k_gamma, eps, n_q_heads, n_kv_heads, head_dim):
    """linear_rowscale_qk_norm_rope after its GEMM (MATH.md): per-head RMSNorm of the q and k heads of z [M, W]
    (gammas [hd] in the paired layout), then RoPE; v passes through. float64 -> (qkv, head_rstd [M, Hq + Hkv])."""
    z64 = R.f64(z)
    M, n_rot = z64.shape[0], n_q_heads + n_kv_heads
    u = z64[:, : n_rot * head_dim].reshape(M, n_rot, head_dim)
    r = torch.rsqrt(u.square().mean(dim=-1) + eps)  # [M, Hq + Hkv]
    g = torch.cat((R.f64(q_gamma).expand(n_q_heads, head_dim), R.f64(k_gamma).expand(n_kv_heads, head_dim)))
    n = torch.cat(((u * r[..., None] * g).reshape(M, n_rot * head_dim), z64[:, n_rot * head_dim:]), dim=1)
    return R.rotate(n, positions, inv_freq, n_rot, head_dim, 1.0), r


@reference
def linear_rowscale_qk_norm_rope_f64(h, w_qkv, rstd, q_gamma, k_gamma, positions, inv_freq, n_q_heads, n_kv_heads,
                                     head_dim, qk_eps, store_z=True):
    """-> (qkv, z), both from the float64 z = diag(rstd) h w_qkv^T, rounded once to h's dtype (z
    None with store_z=False)."""
    z = R.rowscale(h, w_qkv, rstd)
    qkv, _ = R.qk_norm_rope(z, positions, inv_freq, q_gamma, k_gamma, qk_eps, n_q_heads, n_kv_heads, head_dim)
    return qkv.to(h.dtype), (z.to(h.dtype) if store_z else None)


@kernel
def qk_norm_rope_bwd_zdz_cuda(z, dqkv, q_gamma, k_gamma, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, qk_eps,
                              hidden_size):
    """The QK-norm + RoPE backward from the pre-norm z: -> (dz, zdz, dq_gamma fp32, dk_gamma fp32)."""
    positions, inv_freq = K.dense(positions), K.dense(inv_freq)
    q_gamma, k_gamma = q_gamma.to(torch.float32).contiguous(), k_gamma.to(torch.float32).contiguous()
    M = z.shape[0]
    dz = torch.empty_like(dqkv, memory_format=torch.contiguous_format)
    zdz = K.f32((M,), z)
    dq_gamma, dk_gamma = K.f32((head_dim,), z), K.f32((head_dim,), z)
    ws = K.workspace("qk_norm_rope_bwd_zdz", z.device, M, head_dim)
    _C.call("qk_norm_rope_bwd_zdz", _d(z), _d(dqkv), _d(q_gamma), _d(k_gamma), _d(positions), _d(inv_freq),
            n_q_heads, n_kv_heads, head_dim, qk_eps, hidden_size, _d(dz), _d(zdz), _d(dq_gamma), _d(dk_gamma),
            ws.data_ptr(), ws.numel(), _C.stream(z.device))
    return dz, zdz, dq_gamma, dk_gamma


@reference
def qk_norm_rope_bwd_f64(z, qkv, dqkv, positions, inv_freq, q_gamma, k_gamma, eps, n_q_heads, n_kv_heads, head_dim,
                         hidden_size):
    """qk_norm_rope_bwd_zdz's math (MATH.md), float64: z the pre-norm input (the QKV GEMM's output), qkv the rotated
    output, dqkv its gradient. -> (dz, zdz, dq_gamma, dk_gamma); zdz from the head dots: (1/d)(sum_h eps r_h^2
    <dqkv_h, qkv_h> + <v, dv>)."""
    z64, y64, dy64 = R.f64(z), R.f64(qkv), R.f64(dqkv)
    M, n_rot = z64.shape[0], n_q_heads + n_kv_heads
    W = n_rot * head_dim
    u = z64[:, :W].reshape(M, n_rot, head_dim)
    r = torch.rsqrt(u.square().mean(dim=-1) + eps)[..., None]  # [M, heads, 1]
    g = torch.cat((R.f64(q_gamma).expand(n_q_heads, head_dim), R.f64(k_gamma).expand(n_kv_heads, head_dim)))
    dn = R.rotate(dy64, positions, inv_freq, n_rot, head_dim, -1.0)[:, :W].reshape(M, n_rot, head_dim)
    s = (dy64[:, :W] * y64[:, :W]).reshape(M, n_rot, head_dim).sum(-1, keepdim=True)  # <dn, n> = <dy, y>
    nh = u * r
    du = r * (g * dn - nh * s / head_dim)
    dz = torch.cat((du.reshape(M, W), dy64[:, W:]), dim=1)
    zdz = ((eps * r.square() * s).sum(dim=(1, 2)) + (z64[:, W:] * dy64[:, W:]).sum(-1)) / hidden_size
    dgamma = (dn * nh).sum(0)  # [heads, hd]
    return dz, zdz, dgamma[:n_q_heads].sum(0), dgamma[n_q_heads:].sum(0)


@reference
def qk_norm_rope_bwd_zdz_f64(z, dqkv, q_gamma, k_gamma, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, qk_eps,
                             hidden_size):
    """coda_qk_norm_rope_bwd_zdz's outputs from qk_norm_rope_bwd (float64): (dz in z's dtype, zdz, dq_gamma,
    dk_gamma), the statistics in R.stat_like's dtype."""
    qkv, _ = R.qk_norm_rope(z, positions, inv_freq, q_gamma, k_gamma, qk_eps, n_q_heads, n_kv_heads, head_dim)
    dz, zdz, dq, dk = R.qk_norm_rope_bwd(z, qkv, dqkv, positions, inv_freq, q_gamma, k_gamma, qk_eps, n_q_heads,
                                         n_kv_heads, head_dim, hidden_size)
    return dz.to(z.dtype), R.stat_like(zdz, z), R.stat_like(dq, z), R.stat_like(dk, z)
