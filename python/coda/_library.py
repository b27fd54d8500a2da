"""CODA's torch operators: torch.library.custom_op definitions (namespace `coda`), their fake (meta) kernels for
torch.compile, and their autograd formulas (register_autograd).

Each operator runs the CUDA kernels (_kernels.py, through the C ABI) on CUDA tensors and the float64 reference
(_reference.py) on CPU tensors. The module-level names are eager fast-path callers (end of file): they skip the
custom-op dispatcher on plain tensors and fall back to the op (`<name>.custom_op`) for everything traced. Arguments are 2-D [tokens, features]; coda.ops flattens leading dimensions and
checks arguments before it calls these.

Autograd boundaries follow the fused backward kernels (MATH.md): an op that consumes a normalised input takes the
un-normalised x and gamma as its differentiable inputs plus (h = x gamma, rstd) as a forward-only cache, so its
backward is one linear_residual_rmsnorm_bwd call giving dx and dgamma directly. Cache outputs (h, rstd, z, ...) are
marked non-differentiable. What each backward saves is what MATH.md lists: x, rstd and the weights for
linear_residual_rmsnorm_bwd; z for linear_swiglu_bwd_zdz; the rotated qkv for rope_bwd_zdz; the block's
coda_block_saved tensors.
"""
from __future__ import annotations

import inspect
from typing import Optional

import torch
from torch import Tensor

from . import _kernels, _reference


# Every op is defined through _custom_op / _register_autograd, which also record the plain function and the autograd
# pair for the eager fast path at the end of this file.
_OPS: dict = {}  # python name -> (custom op, function, mutated argument names)
_AUTOGRAD: dict = {}  # custom op -> (setup_context, backward)


def _custom_op(name: str, mutates_args):
    def define(fn):
        op = torch.library.custom_op(name, mutates_args=mutates_args)(fn)
        _OPS[fn.__name__] = (op, fn, tuple(mutates_args))
        return op
    return define


def _register_autograd(op, backward, setup_context):
    op.register_autograd(backward, setup_context=setup_context)
    _AUTOGRAD[op] = (setup_context, backward)


def _impl(t: Tensor):
    return _kernels if t.is_cuda else _reference


def _stat_dtype(t: Tensor):
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _stat(shape, like: Tensor):
    return like.new_empty(shape, dtype=_stat_dtype(like))


def _loss_shape(M, reduction):
    return (M,) if reduction == "none" else ()


def _no_grad_outputs(ctx, *outputs):
    ctx.mark_non_differentiable(*outputs)
    ctx.set_materialize_grads(False)


def _rowdot(a: Tensor, b: Tensor, d: int) -> Tensor:
    """(1/d) sum_j a[m,j] b[m,j] in fp32 (float64 for float64 inputs): the zdz of a dgrad whose output was stored."""
    dt = _stat_dtype(a)
    return (a.to(dt) * b.to(dt)).sum(-1) / d


# ---- forward-only cache: first-layer norm --------------------------------------------------------------------------

@_custom_op("coda::rmsnorm_prepare", mutates_args=())
def rmsnorm_prepare(x: Tensor, gamma: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return _impl(x).rmsnorm_prepare(x, gamma, eps)


@rmsnorm_prepare.register_fake
def _(x, gamma, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format), _stat((x.shape[0],), x)


def _prepare_ctx(ctx, inputs, output):
    _no_grad_outputs(ctx, *output)


_register_autograd(rmsnorm_prepare, lambda ctx, dh, drstd: (None, None, None), _prepare_ctx)


# ---- linear_residual_rmsnorm: out/down projection + residual + the next norm's first half -------------------------

@_custom_op("coda::linear_residual_rmsnorm", mutates_args=())
def linear_residual_rmsnorm(a: Tensor, w: Tensor, residual: Tensor, gamma: Tensor,
                            eps: float) -> tuple[Tensor, Tensor, Tensor]:
    return _impl(a).linear_residual_rmsnorm(a, w, residual, gamma, eps)


@linear_residual_rmsnorm.register_fake
def _(a, w, residual, gamma, eps):
    x = a.new_empty((a.shape[0], w.shape[0]))
    return x, torch.empty_like(x), _stat((a.shape[0],), a)


def _linear_residual_rmsnorm_ctx(ctx, inputs, output):
    a, w, _, _, _ = inputs
    ctx.save_for_backward(a, w)
    _no_grad_outputs(ctx, output[1], output[2])


def _linear_residual_rmsnorm_grad(ctx, dx, dh, drstd):
    a, w = ctx.saved_tensors
    if dx is None:
        return None, None, None, None, None
    dx = dx.contiguous()
    da = dx @ w if ctx.needs_input_grad[0] else None
    dw = dx.t() @ a if ctx.needs_input_grad[1] else None
    return da, dw, dx, None, None


_register_autograd(linear_residual_rmsnorm, _linear_residual_rmsnorm_grad, _linear_residual_rmsnorm_ctx)


# ---- linear_residual_rmsnorm_bwd and the ops whose backward it is -----------------------------------------------

@_custom_op("coda::linear_residual_rmsnorm_bwd", mutates_args=())
def linear_residual_rmsnorm_bwd(dz: Tensor, w: Tensor, x: Tensor, gamma: Tensor, rstd: Tensor, zdz: Tensor,
                                dx_in: Optional[Tensor], alpha: float) -> tuple[Tensor, Tensor, Tensor]:
    return _impl(x).linear_residual_rmsnorm_bwd(dz, w, x, gamma, rstd, zdz, dx_in, alpha)


@linear_residual_rmsnorm_bwd.register_fake
def _(dz, w, x, gamma, rstd, zdz, dx_in, alpha):
    dx = x.new_empty(x.shape)
    return dx, torch.empty_like(dx), _stat((x.shape[1],), x)


def _norm_linear_bwd(dz, zdz, x, gamma, w, rstd, dx_in=None):
    """linear_residual_rmsnorm_bwd then dW = dz^T a: the gradients of y = rmsnorm(x; gamma) w^T given dz (and zdz
    for it)."""
    dx, a, dgamma = linear_residual_rmsnorm_bwd(dz, w, x, gamma, rstd, zdz, dx_in, 1.0)
    dw = dz.t() @ a
    return dx, dgamma.to(gamma.dtype), dw


@_custom_op("coda::rmsnorm_linear", mutates_args=())
def rmsnorm_linear(x: Tensor, gamma: Tensor, w: Tensor, h: Tensor, rstd: Tensor) -> Tensor:
    return _impl(h).linear_rowscale(h, w, rstd)


@rmsnorm_linear.register_fake
def _(x, gamma, w, h, rstd):
    return h.new_empty((h.shape[0], w.shape[0]))


def _rmsnorm_linear_ctx(ctx, inputs, output):
    x, gamma, w, _, rstd = inputs
    ctx.save_for_backward(x, gamma, w, rstd, output)


def _rmsnorm_linear_bwd(ctx, dy):
    x, gamma, w, rstd, y = ctx.saved_tensors
    dy = dy.contiguous()
    dx, dgamma, dw = _norm_linear_bwd(dy, _rowdot(y, dy, x.shape[1]), x, gamma, w, rstd)
    return dx, dgamma, dw, None, None


_register_autograd(rmsnorm_linear, _rmsnorm_linear_bwd, _rmsnorm_linear_ctx)


# ---- linear_rowscale_rope / rope_bwd_zdz: q/k/v projection with RoPE --------------------------------------------

@_custom_op("coda::rope_bwd_zdz", mutates_args=())
def rope_bwd_zdz(qkv: Tensor, dqkv: Tensor, positions: Tensor, inv_freq: Tensor, n_q_heads: int, n_kv_heads: int,
                 head_dim: int, hidden_size: int) -> tuple[Tensor, Tensor]:
    return _impl(qkv).rope_bwd_zdz(qkv, dqkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, hidden_size)


@rope_bwd_zdz.register_fake
def _(qkv, dqkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, hidden_size):
    return dqkv.new_empty(dqkv.shape), _stat((qkv.shape[0],), qkv)


@_custom_op("coda::rmsnorm_qkv_rope", mutates_args=())
def rmsnorm_qkv_rope(x: Tensor, gamma: Tensor, w_qkv: Tensor, h: Tensor, rstd: Tensor, positions: Tensor,
                      inv_freq: Tensor, n_q_heads: int, n_kv_heads: int, head_dim: int) -> Tensor:
    return _impl(h).linear_rowscale_rope(h, w_qkv, rstd, positions, inv_freq, n_q_heads, n_kv_heads, head_dim)


@rmsnorm_qkv_rope.register_fake
def _(x, gamma, w_qkv, h, rstd, positions, inv_freq, n_q_heads, n_kv_heads, head_dim):
    return h.new_empty((h.shape[0], w_qkv.shape[0]))


def _qkv_rope_ctx(ctx, inputs, output):
    x, gamma, w_qkv, _, rstd, positions, inv_freq, hq, hkv, hd = inputs
    ctx.save_for_backward(x, gamma, w_qkv, rstd, positions, inv_freq, output)
    ctx.heads = (hq, hkv, hd)


def _qkv_rope_bwd(ctx, dqkv):
    x, gamma, w_qkv, rstd, positions, inv_freq, qkv = ctx.saved_tensors
    dz, zdz = rope_bwd_zdz(qkv, dqkv.contiguous(), positions, inv_freq, *ctx.heads, x.shape[1])
    dx, dgamma, dw = _norm_linear_bwd(dz, zdz, x, gamma, w_qkv, rstd)
    return dx, dgamma, dw, None, None, None, None, None, None, None


_register_autograd(rmsnorm_qkv_rope, _qkv_rope_bwd, _qkv_rope_ctx)


# ---- linear_rowscale_qk_norm_rope / qk_norm_rope_bwd_zdz: the Qwen3 q/k/v projection ----------------------------

@_custom_op("coda::rmsnorm_qkv_qk_norm_rope", mutates_args=())
def rmsnorm_qkv_qk_norm_rope(x: Tensor, gamma: Tensor, w_qkv: Tensor, h: Tensor, rstd: Tensor, q_gamma: Tensor,
                              k_gamma: Tensor, positions: Tensor, inv_freq: Tensor, n_q_heads: int, n_kv_heads: int,
                              head_dim: int, qk_eps: float) -> tuple[Tensor, Tensor]:
    return _impl(h).linear_rowscale_qk_norm_rope(h, w_qkv, rstd, q_gamma, k_gamma, positions, inv_freq, n_q_heads,
                                                 n_kv_heads, head_dim, qk_eps)


@rmsnorm_qkv_qk_norm_rope.register_fake
def _(x, gamma, w_qkv, h, rstd, q_gamma, k_gamma, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, qk_eps):
    return h.new_empty((h.shape[0], w_qkv.shape[0])), h.new_empty((h.shape[0], w_qkv.shape[0]))


@_custom_op("coda::qk_norm_rope_bwd_zdz", mutates_args=())
def qk_norm_rope_bwd_zdz(z: Tensor, dqkv: Tensor, q_gamma: Tensor, k_gamma: Tensor, positions: Tensor,
                         inv_freq: Tensor, n_q_heads: int, n_kv_heads: int, head_dim: int, qk_eps: float,
                         hidden_size: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _impl(z).qk_norm_rope_bwd_zdz(z, dqkv, q_gamma, k_gamma, positions, inv_freq, n_q_heads, n_kv_heads,
                                         head_dim, qk_eps, hidden_size)


@qk_norm_rope_bwd_zdz.register_fake
def _(z, dqkv, q_gamma, k_gamma, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, qk_eps, hidden_size):
    return (dqkv.new_empty(dqkv.shape), _stat((z.shape[0],), z), _stat((head_dim,), z), _stat((head_dim,), z))


def _qkv_qk_norm_rope_ctx(ctx, inputs, output):
    x, gamma, w_qkv, _, rstd, q_gamma, k_gamma, positions, inv_freq, hq, hkv, hd, qk_eps = inputs
    ctx.save_for_backward(x, gamma, w_qkv, rstd, q_gamma, k_gamma, positions, inv_freq, output[1])
    ctx.heads = (hq, hkv, hd)
    ctx.qk_eps = qk_eps
    _no_grad_outputs(ctx, output[1])


def _qkv_qk_norm_rope_bwd(ctx, dqkv, dz_unused):
    x, gamma, w_qkv, rstd, q_gamma, k_gamma, positions, inv_freq, z = ctx.saved_tensors
    if dqkv is None:
        return (None,) * 13
    dz, zdz, dq_gamma, dk_gamma = qk_norm_rope_bwd_zdz(z, dqkv.contiguous(), q_gamma, k_gamma, positions, inv_freq,
                                                       *ctx.heads, ctx.qk_eps, x.shape[1])
    dx, dgamma, dw = _norm_linear_bwd(dz, zdz, x, gamma, w_qkv, rstd)
    return (dx, dgamma, dw, None, None, dq_gamma.to(q_gamma.dtype), dk_gamma.to(k_gamma.dtype), None, None, None,
            None, None, None)


_register_autograd(rmsnorm_qkv_qk_norm_rope, _qkv_qk_norm_rope_bwd, _qkv_qk_norm_rope_ctx)


# ---- the SwiGLU MLP with its residual and the next norm's first half ---------------------------------------------
# (linear_rowscale_swiglu + linear_residual_rmsnorm; backward linear_swiglu_bwd_zdz + linear_residual_rmsnorm_bwd)

@_custom_op("coda::linear_swiglu_bwd_zdz", mutates_args=())
def linear_swiglu_bwd_zdz(dx: Tensor, w_down: Tensor, z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return _impl(dx).linear_swiglu_bwd_zdz(dx, w_down, z)


@linear_swiglu_bwd_zdz.register_fake
def _(dx, w_down, z):
    return z.new_empty(z.shape), dx.new_empty((dx.shape[0], w_down.shape[1])), _stat((dx.shape[0],), dx)


@_custom_op("coda::swiglu_mlp", mutates_args=())
def swiglu_mlp(x: Tensor, gamma: Tensor, w_gu: Tensor, w_down: Tensor, h: Tensor, rstd: Tensor, next_gamma: Tensor,
               eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    impl = _impl(h)
    z, y = impl.linear_rowscale_swiglu(h, w_gu, rstd)
    x_out, h_next, rstd_next = impl.linear_residual_rmsnorm(y, w_down, x, next_gamma, eps)
    return x_out, h_next, rstd_next, z


@swiglu_mlp.register_fake
def _(x, gamma, w_gu, w_down, h, rstd, next_gamma, eps):
    x_out = x.new_empty(x.shape)
    return x_out, torch.empty_like(x_out), _stat((x.shape[0],), x), h.new_empty((h.shape[0], w_gu.shape[0]))


def _mlp_ctx(ctx, inputs, output):
    x, gamma, w_gu, w_down, _, rstd, _, _ = inputs
    ctx.save_for_backward(x, gamma, w_gu, w_down, rstd, output[3])
    _no_grad_outputs(ctx, output[1], output[2], output[3])


def _mlp_bwd(ctx, dx_out, dh, drstd, dz_unused):
    x, gamma, w_gu, w_down, rstd, z = ctx.saved_tensors
    if dx_out is None:
        return (None,) * 8
    dx_out = dx_out.contiguous()
    dz, y, zdz = linear_swiglu_bwd_zdz(dx_out, w_down, z)
    dw_down = dx_out.t() @ y
    dx, dgamma, dw_gu = _norm_linear_bwd(dz, zdz, x, gamma, w_gu, rstd, dx_in=dx_out)
    return dx, dgamma, dw_gu, dw_down, None, None, None, None


_register_autograd(swiglu_mlp, _mlp_bwd, _mlp_ctx)


# ---- the whole CODA block -------------------------------------------------------------------------------------

@_custom_op("coda::block_forward", mutates_args=())
def block_forward(y0: Tensor, x0: Tensor, w_o: Tensor, gamma1: Tensor, w_gu: Tensor, w_down: Tensor, gamma2: Tensor,
                  w_qkv: Tensor, positions: Tensor, inv_freq: Tensor, n_q_heads: int, n_kv_heads: int, head_dim: int,
                  eps: float, q_gamma: Optional[Tensor], k_gamma: Optional[Tensor], qk_eps: float,
                  inplace_backward: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The saved tensors (x1, rstd1, z1, x2, rstd2, qkv, z); z (the pre-norm q/k/v projection, saved for the QK-norm's
    backward) is empty without q_gamma / k_gamma."""
    *saved, z = _impl(x0).block_forward(y0, x0, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, positions, inv_freq,
                                        n_q_heads, n_kv_heads, head_dim, eps, q_gamma, k_gamma, qk_eps)
    return (*saved, x0.new_empty(0) if z is None else z)  # inplace_backward: backward only


@block_forward.register_fake
def _(y0, x0, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, eps,
      q_gamma, k_gamma, qk_eps, inplace_backward):
    M, d = x0.shape
    x1 = x0.new_empty((M, d))
    qkv = x0.new_empty((M, w_qkv.shape[0]))
    return (x1, _stat((M,), x0), x0.new_empty((M, w_gu.shape[0])), torch.empty_like(x1), _stat((M,), x0), qkv,
            torch.empty_like(qkv) if q_gamma is not None else x0.new_empty(0))


@_custom_op("coda::block_backward", mutates_args=("z1", "dqkv"))
def block_backward(y0: Tensor, positions: Tensor, inv_freq: Tensor, w_o: Tensor, gamma1: Tensor, w_gu: Tensor,
                   w_down: Tensor, gamma2: Tensor, w_qkv: Tensor, x1: Tensor, rstd1: Tensor, z1: Tensor, x2: Tensor,
                   rstd2: Tensor, qkv: Tensor, dqkv: Tensor, dx2: Optional[Tensor], n_q_heads: int, n_kv_heads: int,
                   head_dim: int, eps: float, z: Optional[Tensor], q_gamma: Optional[Tensor],
                   k_gamma: Optional[Tensor], qk_eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                                                                      Tensor, Tensor, Tensor, Tensor]:
    """-> (dy0, dx0, dw_o, dgamma1, dw_gu, dw_down, dgamma2, dw_qkv, dq_gamma, dk_gamma); the last two empty without
    the QK-norm."""
    *grads, dgq, dgk = _impl(x1).block_backward(y0, positions, inv_freq, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, x1,
                                                rstd1, z1, x2, rstd2, qkv, dqkv, dx2, n_q_heads, n_kv_heads,
                                                head_dim, eps, z, q_gamma, k_gamma, qk_eps)
    if dgq is None:
        dgq, dgk = _stat((0,), x1), _stat((0,), x1)
    return (*grads, dgq, dgk)


@block_backward.register_fake
def _(y0, positions, inv_freq, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, x1, rstd1, z1, x2, rstd2, qkv, dqkv, dx2,
      n_q_heads, n_kv_heads, head_dim, eps, z, q_gamma, k_gamma, qk_eps):
    d = x1.shape[1]
    n = head_dim if q_gamma is not None else 0
    return (y0.new_empty(y0.shape), x1.new_empty(x1.shape), w_o.new_empty(w_o.shape), _stat((d,), x1),
            w_gu.new_empty(w_gu.shape), w_down.new_empty(w_down.shape), _stat((d,), x1), w_qkv.new_empty(w_qkv.shape),
            _stat((n,), x1), _stat((n,), x1))


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
    _no_grad_outputs(ctx, x1, rstd1, z1, rstd2, z)


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
    dy0, dx0, dw_o, dg1, dw_gu, dw_down, dg2, dw_qkv, dgq, dgk = block_backward(*saved, dqkv, dx2, *ctx.config, z,
                                                                              q_gamma, k_gamma, ctx.qk_eps)
    gamma1, gamma2 = saved[4], saved[7]
    if q_gamma is None:
        dgq = dgk = None
    else:
        dgq, dgk = dgq.to(q_gamma.dtype), dgk.to(k_gamma.dtype)
    return (dy0, dx0, dw_o, dg1.to(gamma1.dtype), dw_gu, dw_down, dg2.to(gamma2.dtype), dw_qkv, None, None, None,
            None, None, None, dgq, dgk, None, None)


_register_autograd(block_forward, _block_bwd, _block_ctx)


# ---- LM head + cross-entropy, and cross-entropy on stored logits ----------------------------------------------

@_custom_op("coda::linear_cross_entropy", mutates_args=())
def linear_cross_entropy(x: Tensor, gamma: Tensor, w: Tensor, h: Tensor, rstd: Tensor, targets: Tensor,
                         ignore_index: int, reduction: str, label_smoothing: float, z_loss: float, softcap: float,
                         chunk_rows: int) -> tuple[Tensor, Tensor]:
    return _impl(h).linear_cross_entropy(h, w, rstd, targets, ignore_index, reduction, label_smoothing, z_loss,
                                         softcap, chunk_rows)


@linear_cross_entropy.register_fake
def _(x, gamma, w, h, rstd, targets, ignore_index, reduction, label_smoothing, z_loss, softcap, chunk_rows):
    M = h.shape[0]
    return _stat(_loss_shape(M, reduction), h), _stat((M,), h)


@_custom_op("coda::linear_cross_entropy_bwd", mutates_args=())
def linear_cross_entropy_bwd(h: Tensor, w: Tensor, rstd: Tensor, x: Tensor, gamma: Tensor, targets: Tensor,
                             grad_loss: Tensor, ignore_index: int, reduction: str, label_smoothing: float,
                             z_loss: float, softcap: float, chunk_rows: int) -> tuple[Tensor, Tensor, Tensor]:
    return _impl(h).linear_cross_entropy_bwd(h, w, rstd, x, gamma, targets, grad_loss, ignore_index, reduction,
                                             label_smoothing, z_loss, softcap, chunk_rows)


@linear_cross_entropy_bwd.register_fake
def _(h, w, rstd, x, gamma, targets, grad_loss, ignore_index, reduction, label_smoothing, z_loss, softcap,
      chunk_rows):
    return x.new_empty(x.shape), _stat(w.shape, h), _stat((h.shape[1],), h)


def _lce_ctx(ctx, inputs, output):
    x, gamma, w, h, rstd, targets, *options = inputs
    ctx.save_for_backward(h, w, rstd, x, gamma, targets)
    ctx.options = options
    _no_grad_outputs(ctx, output[1])


def _lce_bwd(ctx, dloss, dlse):
    h, w, rstd, x, gamma, targets = ctx.saved_tensors
    if dloss is None:
        return (None,) * 12
    grad_loss = dloss.to(_stat_dtype(h)).contiguous()
    dx, dw, dgamma = linear_cross_entropy_bwd(h, w, rstd, x, gamma, targets, grad_loss, *ctx.options)
    return dx, dgamma.to(gamma.dtype), dw.to(w.dtype), None, None, None, None, None, None, None, None, None


_register_autograd(linear_cross_entropy, _lce_bwd, _lce_ctx)


@_custom_op("coda::linear_cross_entropy_train", mutates_args=())
def linear_cross_entropy_train(x: Tensor, gamma: Tensor, w: Tensor, h: Tensor, rstd: Tensor, targets: Tensor,
                               ignore_index: int, reduction: str, label_smoothing: float, z_loss: float,
                               softcap: float, chunk_rows: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The training step of the LM head in one pass: loss and its gradients for an upstream gradient of 1
    (coda_linear_cross_entropy_bwd with loss_out: 3 GEMMs of M x V x d instead of 4 for forward + backward).
    Mean and sum reductions only: their gradients scale with the scalar upstream gradient."""
    dx, dw, dgamma, loss = _impl(h).linear_cross_entropy_bwd(h, w, rstd, x, gamma, targets, None, ignore_index,
                                                             reduction, label_smoothing, z_loss, softcap, chunk_rows,
                                                             want_loss=True)
    return loss, dx, dw, dgamma


@linear_cross_entropy_train.register_fake
def _(x, gamma, w, h, rstd, targets, ignore_index, reduction, label_smoothing, z_loss, softcap, chunk_rows):
    return _stat((), h), x.new_empty(x.shape), _stat(w.shape, h), _stat((h.shape[1],), h)


def _lce_train_ctx(ctx, inputs, output):
    x, gamma, w = inputs[:3]
    loss, dx, dw, dgamma = output
    ctx.save_for_backward(dx, dw, dgamma)
    ctx.dtypes = (gamma.dtype, w.dtype)
    _no_grad_outputs(ctx, dx, dw, dgamma)


def _scaled_cast(t: Tensor, g: Tensor, dtype: torch.dtype) -> Tensor:
    """(t * g).to(dtype) for an fp32 t and a scalar tensor g, one rounding, in one pass with no fp32 temporary:
    torch.mul computes in fp32 and rounds as it stores into the `dtype` output (the same bits as the product, then
    the cast). The saved fp32 weight gradient of the LM head is [V, d] (1 GiB at llama3-1B): the plain expression
    doubled it at peak, and a block-by-block product + copy took two kernels per block. Eager on CUDA it is one
    vectorised coda_scale_cast (same bits); traced or compiled, torch.mul. A backward with create_graph (g requires
    grad) takes the plain expression: out= has no autograd formula."""
    if torch.is_grad_enabled() and (g.requires_grad or t.requires_grad):
        return (t * g).to(dtype)
    if (eager_plain((t, g)) and t.is_cuda and g.device == t.device and t.device.index == torch.cuda.current_device()
            and t.dtype == g.dtype == torch.float32 and g.numel() == 1 and t.is_contiguous()
            and dtype in (torch.bfloat16, torch.float16)):
        # the same bits through coda_scale_cast: PyTorch's mixed-dtype loop moved 1 GiB at ~1.2 TB/s on the H200
        return _kernels.scale_cast(t, g, dtype)
    return torch.mul(t, g, out=torch.empty(t.shape, dtype=dtype, device=t.device))


def _lce_train_bwd(ctx, dloss, *unused):
    dx, dw, dgamma = ctx.saved_tensors
    if dloss is None:
        return (None,) * 12
    g = dloss.to(dw.dtype)
    return ((dx * g).to(dx.dtype), (dgamma * g).to(ctx.dtypes[0]), _scaled_cast(dw, g, ctx.dtypes[1]), None, None,
            None, None, None, None, None, None, None)


_register_autograd(linear_cross_entropy_train, _lce_train_bwd, _lce_train_ctx)


@_custom_op("coda::cross_entropy", mutates_args=())
def cross_entropy(logits: Tensor, targets: Tensor, ignore_index: int, reduction: str, label_smoothing: float,
                  z_loss: float, softcap: float) -> Tensor:
    return _impl(logits).cross_entropy(logits, targets, None, ignore_index, reduction, label_smoothing, z_loss,
                                       softcap, 1, False)[0]


@cross_entropy.register_fake
def _(logits, targets, ignore_index, reduction, label_smoothing, z_loss, softcap):
    return _stat(_loss_shape(logits.shape[0], reduction), logits)


@_custom_op("coda::cross_entropy_bwd", mutates_args=())
def cross_entropy_bwd(logits: Tensor, targets: Tensor, grad_loss: Tensor, ignore_index: int, reduction: str,
                      label_smoothing: float, z_loss: float, softcap: float) -> Tensor:
    return _impl(logits).cross_entropy(logits, targets, grad_loss, ignore_index, reduction, label_smoothing, z_loss,
                                       softcap, 1, True)[1]


@cross_entropy_bwd.register_fake
def _(logits, targets, grad_loss, ignore_index, reduction, label_smoothing, z_loss, softcap):
    return logits.new_empty(logits.shape)


def _ce_ctx(ctx, inputs, output):
    logits, targets, *options = inputs
    ctx.save_for_backward(logits, targets)
    ctx.options = options


def _ce_bwd(ctx, dloss):
    logits, targets = ctx.saved_tensors
    grad_loss = dloss.to(_stat_dtype(logits)).contiguous()
    return cross_entropy_bwd(logits, targets, grad_loss, *ctx.options), None, None, None, None, None, None


_register_autograd(cross_entropy, _ce_bwd, _ce_ctx)


# ---- the eager fast path ----------------------------------------------------------------------------------------
# A custom_op call costs ~0.1-0.2 ms of host time in eager mode (measured on the development VM with torch 2.15 for
# the 15-argument block forward; cProfile puts most of it in torch's per-call fill_defaults), and the GPU waits that
# long before the op's first kernel whenever the host is not ahead of it (profiles/block_llama3-8b_h200_2bd6ceb.txt:
# 0.77 ms idle before the block forward's first GEMM). Eagerly, on plain tensors and with no dispatch mode active,
# each op runs its function directly, inside a torch.autograd.Function with the same setup_context and backward when
# gradients are needed. Traced, fake and subclassed tensors (torch.compile, export, FakeTensorMode), keyword
# arguments and active dispatch modes take the custom op as before. Arguments an op mutates get the version bump
# the custom op gives them, so autograd's saved-tensor check still refuses a second backward through a block whose
# in-place backward overwrote z1.

try:
    from torch.utils._python_dispatch import _get_current_dispatch_mode as _dispatch_mode
except ImportError:  # unknown torch layout: always go through the custom op
    def _dispatch_mode():
        return True


def _tracing_or_transformed():
    """torch.jit.trace (it must record the op: on CUDA the kernels are ctypes calls it cannot see) or an active
    functorch transform (vmap, grad, jvp: the wrapped tensors look plain, and the kernels cannot take them)."""
    try:
        return torch._C._is_tracing() or torch._C._are_functorch_transforms_active()
    except AttributeError:  # unknown torch layout: go through the custom op
        return True


_PLAIN = (torch.Tensor, torch.nn.Parameter)  # a model's weights are Parameters; any other subclass may dispatch


def eager_plain(args) -> bool:
    """True when a call with these arguments runs plainly eager: not under torch.compile, no dispatch mode, no jit
    trace or functorch transform, every tensor argument a plain Tensor or Parameter. Then an op may take its fast
    path (its function directly) and ops.block may reuse its argument checks."""
    return not (torch.compiler.is_compiling() or _dispatch_mode() is not None or _tracing_or_transformed()
                or not all(type(a) in _PLAIN for a in args if isinstance(a, Tensor)))


def _eager(name: str):
    op, fn, mutated = _OPS[name]
    params = list(inspect.signature(fn).parameters)
    mutated_at = tuple(params.index(m) for m in mutated)
    grad = _AUTOGRAD.get(op)
    function = None
    if grad is not None:
        setup_context, backward = grad

        def forward(ctx, *args):
            out = fn(*args)
            setup_context(ctx, args, out)
            return out

        function = type(f"{name}_function", (torch.autograd.Function,),
                        {"forward": staticmethod(forward), "backward": staticmethod(backward)})

    def call(*args, **kwargs):
        if kwargs or not eager_plain(args):
            return op(*args, **kwargs)
        wants_grad = torch.is_grad_enabled() and any(isinstance(a, Tensor) and a.requires_grad for a in args)
        if wants_grad:
            if function is None:  # no autograd formula: the custom op raises autograd's own error
                return op(*args)
            return function.apply(*args)
        out = fn(*args)
        for i in mutated_at:
            if args[i] is not None:
                torch.autograd.graph.increment_version(args[i])
        return out

    call.__name__ = call.__qualname__ = name
    call.__doc__ = fn.__doc__
    call.custom_op = op
    return call


for _name in list(_OPS):
    globals()[_name] = _eager(_name)
del _name
