"""The whole CODA block (include/coda/block.h): from layer i's attention output to layer i+1's q/k/v, forward
(block_forward) and backward (block_backward), with or without Qwen3's QK-norm.

Here: the public function (coda.ops.block), its custom ops with fake kernels and autograd (_library), the CUDA calls
(`<op>_cuda`, read as _kernels.<op>) and their float64 twins (`<op>_f64`, read as _reference.<op>), which compose the
other families' twins; MATH.md "One block" has the equations.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import _C
from .. import _check as check
from .. import _kernels as K
from .. import _library as lib
from .. import _reference as R
from .._kernels import kernel
from .._library import custom_op, impl, no_grad_outputs, register_autograd, stat
from .._reference import reference
from ._common import library_names, norm_args, rows, same

_d = _C.desc

__all__ = ["block"]


# ---- public op -------------------------------------------------------------------------------------------------------

@library_names(block_forward={
    **same("y0", "x0", "positions", "inv_freq", "eps"),
    **{f"weights.{n}": n for n in ("w_o", "gamma1", "w_gu", "w_down", "gamma2", "w_qkv", "q_gamma", "k_gamma")},
    "config.hidden_size": "x0.shape[-1]", "config.intermediate_size": "w_down.shape[1]",
    **{f"config.{n}": n for n in ("n_q_heads", "n_kv_heads", "head_dim", "eps", "qk_eps")}})
def block(y0, x0, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim,
          eps=1e-6, *, q_gamma=None, k_gamma=None, qk_eps=None, inplace_backward=True):
    """One CODA block (MATH.md "One block"; include/coda/block.h): from layer i's attention output to layer i+1's
    q/k/v.  x1 = y0 w_o^T + x0;  x2 = x1 + mlp(rmsnorm(x1; gamma1));  qkv = RoPE(rmsnorm(x2; gamma2) w_qkv^T).
    With q_gamma and k_gamma (layer i+1's q_norm / k_norm weights, [head_dim] each in the paired layout, as for
    rmsnorm_qkv_qk_norm_rope; Qwen3): qkv = RoPE(qk_norm(rmsnorm(x2; gamma2) w_qkv^T)) with epsilon qk_eps (default
    eps), and their gradients flow back; the pre-norm projection z [tokens, (hq + 2 hkv) hd] is saved for the
    backward instead of being recomputed.

    y0 [..., hq hd]; x0 [..., d]; weights as in swiglu_mlp and rmsnorm_qkv_rope (CODA layouts); positions [...];
    inv_freq [hd/2]. Returns (x2 [..., d], qkv [..., (hq + 2 hkv) hd]). Forward: 4 fused GEMMs; backward: 3 fused
    dgrads + 5 plain GEMMs (coda_block_backward). Saves x1, rstd1, z1, x2, rstd2, qkv, with the QK-norm also z (h1,
    h2, y1 and, without the QK-norm, the pre-RoPE q/k/v are not stored). The backward overwrites the saved z1 with
    dz1 (no extra [tokens, 2F] buffer), so a graph through a block can be backpropagated once: a second backward
    (retain_graph=True, gradcheck) is refused by autograd's version check. inplace_backward=False keeps z1 (the
    backward works on a copy) for such uses.
    """
    tensors = (y0, x0, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, positions, inv_freq)
    qk = (q_gamma, k_gamma) if q_gamma is not None or k_gamma is not None else ()
    if qk_eps is not None and not qk:
        raise ValueError("coda.block: `qk_eps` is the QK-norm's epsilon: it needs `q_gamma` and `k_gamma`")
    qk_eps = eps if qk_eps is None else qk_eps
    key = _signature(tensors + qk, (n_q_heads, n_kv_heads, head_dim, eps, qk_eps if qk else None))
    if key is None or key != _block_checked[0]:
        _block_checks(*tensors, n_q_heads, n_kv_heads, head_dim, eps)
        if qk:
            _block_qk_checks(x0, q_gamma, k_gamma, head_dim, qk_eps)
        if key is not None:
            _block_checked[0] = key
    pos = positions.reshape(-1).to(torch.int32)
    inv = inv_freq.to(torch.float32) if x0.is_cuda else inv_freq
    x1, rstd1, z1, x2, rstd2, qkv, z = block_forward_op(
        rows(y0), rows(x0), w_o, gamma1, w_gu, w_down, gamma2, w_qkv, pos, inv, int(n_q_heads), int(n_kv_heads),
        int(head_dim), float(eps), q_gamma, k_gamma, float(qk_eps) if qk else 0.0, bool(inplace_backward))
    return x2.reshape(x0.shape), qkv.reshape(*x0.shape[:-1], w_qkv.shape[0])


# The argument signature of the last block call that passed _block_checks: a model calls block once per layer with
# the same shapes, dtypes and devices, and the checks (~0.1 ms of Python per call on the development VM, all before
# the first kernel) depend on nothing else. One entry, per process; a changed signature is checked again.
_block_checked = [None]


def _signature(tensors, scalars):
    """(type, shape, dtype, device) of each tensor plus the scalars; None (run the checks, store nothing) when an
    argument is not a plain tensor or Parameter, or while anything traces: torch.compile, make_fx and other dispatch
    modes, jit tracing, functorch transforms. Their shapes can be symbolic, and a stored one would outlive the trace
    or turn into a guard of the next one."""
    if not (lib.eager_plain(tensors) and all(isinstance(t, torch.Tensor) for t in tensors)):
        return None
    return tuple((type(t), t.shape, t.dtype, t.device) for t in tensors) + tuple((type(v), v) for v in scalars)


def _block_checks(y0, x0, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads,
                  head_dim, eps):
    op = "block"
    norm_args(op, x0, gamma1, w_gu, eps, ("x0", "gamma1", "w_gu"))
    for name, t in (("y0", y0), ("w_o", w_o), ("w_down", w_down), ("gamma2", gamma2), ("w_qkv", w_qkv)):
        check.tensor(op, name, t, floating=True, rank=None if name == "y0" else (1 if "gamma" in name else 2))
    check.tensor(op, "positions", positions, dtype=(torch.int32, torch.int64))
    check.tensor(op, "inv_freq", inv_freq, rank=1, floating=True)
    check.same_device(op, x0=x0, y0=y0, w_o=w_o, w_down=w_down, gamma2=gamma2, w_qkv=w_qkv, positions=positions,
                      inv_freq=inv_freq)
    check.same_dtype(op, "x0", x0, y0=y0, w_o=w_o, w_down=w_down, gamma2=gamma2, w_qkv=w_qkv)
    d = x0.shape[-1]
    check.heads(op, w_qkv.shape[0], n_q_heads, n_kv_heads, head_dim)
    if w_o.shape != (d, n_q_heads * head_dim) or y0.shape != (*x0.shape[:-1], n_q_heads * head_dim):
        raise ValueError(f"coda.{op}: `w_o` must be [d, hq hd] = {(d, n_q_heads * head_dim)} and `y0` "
                         f"[..., hq hd] with x0's leading shape; got w_o {tuple(w_o.shape)}, y0 {tuple(y0.shape)}")
    if w_gu.shape[0] % 2 or w_down.shape != (d, w_gu.shape[0] // 2):
        raise ValueError(f"coda.{op}: `w_down` must be [d, F] = {(d, w_gu.shape[0] // 2)}, got "
                         f"{tuple(w_down.shape)}")
    check.size(op, "gamma2", gamma2, 0, d, "d")
    check.size(op, "w_qkv", w_qkv, 1, d, "d")
    if positions.shape != x0.shape[:-1]:
        raise ValueError(f"coda.{op}: `positions` must have shape {tuple(x0.shape[:-1])}, got "
                         f"{tuple(positions.shape)}")
    check.size(op, "inv_freq", inv_freq, 0, head_dim // 2, "head_dim / 2")


def _block_qk_checks(x0, q_gamma, k_gamma, head_dim, qk_eps):
    op = "block"
    if q_gamma is None or k_gamma is None:
        raise ValueError(f"coda.{op}: `q_gamma` and `k_gamma` go together (the QK-norm of q and of k); got only "
                         f"`{'k_gamma' if q_gamma is None else 'q_gamma'}`")
    for name, t in (("q_gamma", q_gamma), ("k_gamma", k_gamma)):
        check.tensor(op, name, t, rank=1, floating=True)
        check.size(op, name, t, 0, head_dim, "head_dim")
    check.same_device(op, x0=x0, q_gamma=q_gamma, k_gamma=k_gamma)
    check.positive(op, "qk_eps", qk_eps)


# ---- custom ops and autograd -----------------------------------------------------------------------------------------

@custom_op("coda::block_forward", mutates_args=())
def block_forward_op(y0: Tensor, x0: Tensor, w_o: Tensor, gamma1: Tensor, w_gu: Tensor, w_down: Tensor, gamma2: Tensor,
                     w_qkv: Tensor, positions: Tensor, inv_freq: Tensor, n_q_heads: int, n_kv_heads: int, head_dim: int,
                     eps: float, q_gamma: Optional[Tensor], k_gamma: Optional[Tensor], qk_eps: float,
                     inplace_backward: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The saved tensors (x1, rstd1, z1, x2, rstd2, qkv, z); z (the pre-norm q/k/v projection, saved for the QK-norm's
    backward) is empty without q_gamma / k_gamma."""
    *saved, z = impl(x0).block_forward(y0, x0, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, positions, inv_freq,
                                       n_q_heads, n_kv_heads, head_dim, eps, q_gamma, k_gamma, qk_eps)
    return (*saved, x0.new_empty(0) if z is None else z)  # inplace_backward: backward only


@block_forward_op.register_fake
def _(y0, x0, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, eps,
      q_gamma, k_gamma, qk_eps, inplace_backward):
    M, d = x0.shape
    x1 = x0.new_empty((M, d))
    qkv = x0.new_empty((M, w_qkv.shape[0]))
    return (x1, stat((M,), x0), x0.new_empty((M, w_gu.shape[0])), torch.empty_like(x1), stat((M,), x0), qkv,
            torch.empty_like(qkv) if q_gamma is not None else x0.new_empty(0))


@custom_op("coda::block_backward", mutates_args=("z1", "dqkv"))
def block_backward_op(y0: Tensor, positions: Tensor, inv_freq: Tensor, w_o: Tensor, gamma1: Tensor, w_gu: Tensor,
                      w_down: Tensor, gamma2: Tensor, w_qkv: Tensor, x1: Tensor, rstd1: Tensor, z1: Tensor, x2: Tensor,
                      rstd2: Tensor, qkv: Tensor, dqkv: Tensor, dx2: Optional[Tensor], n_q_heads: int, n_kv_heads: int,
                      head_dim: int, eps: float, z: Optional[Tensor], q_gamma: Optional[Tensor],
                      k_gamma: Optional[Tensor], qk_eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                                                                         Tensor, Tensor, Tensor, Tensor]:
    """-> (dy0, dx0, dw_o, dgamma1, dw_gu, dw_down, dgamma2, dw_qkv, dq_gamma, dk_gamma); the last two empty without
    the QK-norm."""
    *grads, dgq, dgk = impl(x1).block_backward(y0, positions, inv_freq, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, x1,
                                               rstd1, z1, x2, rstd2, qkv, dqkv, dx2, n_q_heads, n_kv_heads,
                                               head_dim, eps, z, q_gamma, k_gamma, qk_eps)
    if dgq is None:
        dgq, dgk = stat((0,), x1), stat((0,), x1)
    return (*grads, dgq, dgk)


@block_backward_op.register_fake
def _(y0, positions, inv_freq, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, x1, rstd1, z1, x2, rstd2, qkv, dqkv, dx2,
      n_q_heads, n_kv_heads, head_dim, eps, z, q_gamma, k_gamma, qk_eps):
    d = x1.shape[1]
    n = head_dim if q_gamma is not None else 0
    return (y0.new_empty(y0.shape), x1.new_empty(x1.shape), w_o.new_empty(w_o.shape), stat((d,), x1),
            w_gu.new_empty(w_gu.shape), w_down.new_empty(w_down.shape), stat((d,), x1), w_qkv.new_empty(w_qkv.shape),
            stat((n,), x1), stat((n,), x1))


def _block_ctx(ctx, inputs, output):
    (y0, _, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, positions, inv_freq, hq, hkv, hd, eps, q_gamma, k_gamma, qk_eps,
     inplace) = inputs
    x1, rstd1, z1, x2, rstd2, qkv, z = output
    qk = q_gamma is not None
    # The first 15 are block_backward's leading arguments, in its order; then the QK-norm's (None without it).
    ctx.save_for_backward(y0, positions, inv_freq, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, x1, rstd1, z1, x2,
                          rstd2, qkv, z if qk else None, q_gamma, k_gamma)
    ctx.config = (hq, hkv, hd, eps)
    ctx.qk_eps = qk_eps
    ctx.inplace = inplace
    no_grad_outputs(ctx, x1, rstd1, z1, rstd2, z)


def _block_bwd(ctx, dx1_, drstd1_, dz1_, dx2, drstd2_, dqkv, dz_):
    try:
        saved = ctx.saved_tensors
    except RuntimeError as e:
        if "inplace" not in str(e):
            raise
        raise RuntimeError("coda.ops.block: a second backward through the same block: the first one overwrote the "
                           "saved z1 with dz1 (in-place backward). Pass inplace_backward=False to coda.ops.block to "
                           "keep z1 (retain_graph, gradcheck).") from e
    saved, (z, q_gamma, k_gamma) = saved[:15], saved[15:]
    qkv = saved[14]
    # The kernel overwrites dqkv (it becomes dz of the q/k/v projection) and z1: the incoming gradient is copied
    # (autograd may hold it elsewhere); z1 is this node's own saved tensor, overwritten unless the caller asked to
    # keep it (inplace_backward=False: a second backward through the graph, e.g. gradcheck or retain_graph). When
    # overwritten, a second backward fails autograd's version check instead of reading dz1.
    dqkv = torch.zeros_like(qkv) if dqkv is None else dqkv.clone(memory_format=torch.contiguous_format)
    if not ctx.inplace:
        saved = saved[:11] + (saved[11].clone(),) + saved[12:]
    dx2 = None if dx2 is None else dx2.contiguous()
    dy0, dx0, dw_o, dg1, dw_gu, dw_down, dg2, dw_qkv, dgq, dgk = block_backward_op(*saved, dqkv, dx2, *ctx.config, z,
                                                                                   q_gamma, k_gamma, ctx.qk_eps)
    gamma1, gamma2 = saved[4], saved[7]
    if q_gamma is None:
        dgq = dgk = None
    else:
        dgq, dgk = dgq.to(q_gamma.dtype), dgk.to(k_gamma.dtype)
    return (dy0, dx0, dw_o, dg1.to(gamma1.dtype), dw_gu, dw_down, dg2.to(gamma2.dtype), dw_qkv, None, None, None,
            None, None, None, dgq, dgk, None, None)


register_autograd(block_forward_op, _block_bwd, _block_ctx)


# ---- CUDA calls and float64 twins ------------------------------------------------------------------------------------

def _block_config(d, F, hq, hkv, hd, eps, qk_eps=0.0):
    c = _C.BlockConfig()
    c.hidden_size, c.intermediate_size = d, F
    c.n_q_heads, c.n_kv_heads, c.head_dim, c.eps, c.qk_eps = hq, hkv, hd, eps, qk_eps
    return c


def _block_weights(w_o, gamma1, w_gu, w_down, gamma2, w_qkv, q_gamma=None, k_gamma=None):
    """The weights struct; q_gamma / k_gamma as the kernel reads them (K.float_pairs), converted by the caller, which
    keeps them alive until the C call: the struct holds their pointers only."""
    return _C.tensors(_C.BlockWeights, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, q_gamma, k_gamma)


def _qk_gammas(q_gamma, k_gamma):
    return (None, None) if q_gamma is None else (K.float_pairs(q_gamma), K.float_pairs(k_gamma))


@kernel
def block_forward_cuda(y0, x0, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads,
                       head_dim, eps, q_gamma=None, k_gamma=None, qk_eps=0.0):
    """The CODA block forward (linear_residual_rmsnorm, linear_rowscale_swiglu, linear_residual_rmsnorm,
    linear_rowscale_rope; with q_gamma / k_gamma linear_rowscale_qk_norm_rope). -> (x1, rstd1, z1, x2, rstd2, qkv,
    z): the saved tensors; z (the pre-norm q/k/v projection) None without the QK-norm."""
    M, d = x0.shape
    F = w_down.shape[1]
    dev, dt = x0.device, x0.dtype
    positions, inv_freq = K.dense(positions), K.dense(inv_freq)
    x1 = torch.empty((M, d), dtype=dt, device=dev)
    z1 = torch.empty((M, 2 * F), dtype=dt, device=dev)
    x2 = torch.empty_like(x1)
    qkv = torch.empty((M, w_qkv.shape[0]), dtype=dt, device=dev)
    z = torch.empty_like(qkv) if q_gamma is not None else None
    q_gamma, k_gamma = _qk_gammas(q_gamma, k_gamma)
    rstd1, rstd2 = K.f32((M,), x0), K.f32((M,), x0)
    cfg = _block_config(d, F, n_q_heads, n_kv_heads, head_dim, eps, qk_eps if q_gamma is not None else 0.0)
    saved = _C.tensors(_C.BlockSaved, x1, rstd1, z1, x2, rstd2, qkv, z)
    ws = _C.workspace(_C.library().coda_block_forward_workspace_size(cfg, M), dev)
    _C.call("block_forward", cfg, _block_weights(w_o, gamma1, w_gu, w_down, gamma2, w_qkv, q_gamma, k_gamma),
            _d(y0), _d(x0), _d(positions), _d(inv_freq), saved, ws.data_ptr(), ws.numel(), _C.stream(dev))
    return x1, rstd1, z1, x2, rstd2, qkv, z


@kernel
def block_backward_cuda(y0, positions, inv_freq, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, x1, rstd1, z1, x2, rstd2,
                        qkv, dqkv, dx2, n_q_heads, n_kv_heads, head_dim, eps, z=None, q_gamma=None, k_gamma=None,
                        qk_eps=0.0):
    """The CODA block backward. z1 and dqkv are overwritten. -> (dy0, dx0, dw_o, dgamma1, dw_gu, dw_down, dgamma2,
    dw_qkv, dq_gamma, dk_gamma); weight gradients in the weights' dtype, the gamma gradients fp32; dq_gamma and
    dk_gamma None without the QK-norm (z, q_gamma, k_gamma as the forward had them)."""
    M, d = x1.shape
    F = w_down.shape[1]
    dev, dt = x1.device, x1.dtype
    qk = q_gamma is not None
    q_gamma, k_gamma = _qk_gammas(q_gamma, k_gamma)
    positions, inv_freq = K.dense(positions), K.dense(inv_freq)
    dy0 = torch.empty_like(y0, memory_format=torch.contiguous_format)
    dx0 = torch.empty((M, d), dtype=dt, device=dev)
    dws = [torch.empty(w.shape, dtype=w.dtype, device=dev) for w in (w_o, w_gu, w_down, w_qkv)]
    dg1, dg2 = K.f32((d,), x1), K.f32((d,), x1)
    dgq, dgk = (K.f32((head_dim,), x1), K.f32((head_dim,), x1)) if qk else (None, None)
    grads = _C.tensors(_C.BlockGrads, dws[0], dg1, dws[1], dws[2], dg2, dws[3], dgq, dgk)
    cfg = _block_config(d, F, n_q_heads, n_kv_heads, head_dim, eps, qk_eps if qk else 0.0)
    saved = _C.tensors(_C.BlockSaved, x1, rstd1, z1, x2, rstd2, qkv, z if qk else None)
    ws = _C.workspace(_C.library().coda_block_backward_workspace_size(cfg, M), dev)
    _C.call("block_backward", cfg, _block_weights(w_o, gamma1, w_gu, w_down, gamma2, w_qkv, q_gamma, k_gamma),
            _d(y0), _d(positions), _d(inv_freq), saved, _d(dqkv), _d(dx2), _d(dy0), _d(dx0), grads, ws.data_ptr(),
            ws.numel(), _C.stream(dev))
    return dy0, dx0, dws[0], dg1, dws[1], dws[2], dg2, dws[3], dgq, dgk


@reference
def block_forward_f64(y0, x0, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads,
                      head_dim, eps, q_gamma=None, k_gamma=None, qk_eps=0.0):
    x1, h1, rstd1 = R.linear_residual_rmsnorm(y0, w_o, x0, gamma1, eps)
    z1, y1 = R.linear_rowscale_swiglu(h1, w_gu, rstd1)
    x2, h2, rstd2 = R.linear_residual_rmsnorm(y1, w_down, x1, gamma2, eps)
    if q_gamma is not None:
        qkv, z = R.linear_rowscale_qk_norm_rope(h2, w_qkv, rstd2, q_gamma, k_gamma, positions, inv_freq, n_q_heads,
                                                n_kv_heads, head_dim, qk_eps)
        return x1, rstd1, z1, x2, rstd2, qkv, z
    qkv = R.linear_rowscale_rope(h2, w_qkv, rstd2, positions, inv_freq, n_q_heads, n_kv_heads, head_dim)
    return x1, rstd1, z1, x2, rstd2, qkv, None


@reference
def block_backward_f64(y0, positions, inv_freq, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, x1, rstd1, z1, x2, rstd2,
                       qkv, dqkv, dx2, n_q_heads, n_kv_heads, head_dim, eps, z=None, q_gamma=None, k_gamma=None,
                       qk_eps=0.0):
    d = x1.shape[1]
    dgq = dgk = None
    if q_gamma is not None:
        dz_qkv, zdz2, dgq, dgk = R.qk_norm_rope_bwd_zdz(z, dqkv, q_gamma, k_gamma, positions, inv_freq, n_q_heads,
                                                        n_kv_heads, head_dim, qk_eps, d)
    else:
        dz_qkv, zdz2 = R.rope_bwd_zdz(qkv, dqkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, d)
    dqkv.copy_(dz_qkv)  # as the kernel: dqkv becomes dz of the q/k/v projection
    dx2_total, a2, dgamma2 = R.linear_residual_rmsnorm_bwd(dz_qkv, w_qkv, x2, gamma2, rstd2, zdz2, dx2, 1.0)
    dw_qkv = (R.f64(dz_qkv).T @ R.f64(a2)).to(w_qkv.dtype)
    dz1, y1, zdz1 = R.linear_swiglu_bwd_zdz(dx2_total, w_down, z1, in_place=True)
    dw_down = (R.f64(dx2_total).T @ R.f64(y1)).to(w_down.dtype)
    dx1, a1, dgamma1 = R.linear_residual_rmsnorm_bwd(dz1, w_gu, x1, gamma1, rstd1, zdz1, dx2_total, 1.0)
    dw_gu = (R.f64(dz1).T @ R.f64(a1)).to(w_gu.dtype)
    dy0 = (R.f64(dx1) @ R.f64(w_o)).to(y0.dtype)
    dw_o = (R.f64(dx1).T @ R.f64(y0)).to(w_o.dtype)
    return dy0, dx1, dw_o, dgamma1, dw_gu, dw_down, dgamma2, dw_qkv, dgq, dgk
