"""The RMSNorm family: the first layer's norm (rmsnorm_prepare), the out/down projection with its residual and the
next norm's statistics (linear_residual_rmsnorm), a normalised input's projection (rmsnorm_linear over
linear_rowscale) and the dgrad that is every normalised projection's backward (linear_residual_rmsnorm_bwd).

Each op here: its public function (coda.ops), its custom op with fake kernel and autograd (_library), its CUDA call
(`<op>_cuda`, read as _kernels.<op>) and its float64 twin (`<op>_f64`, read as _reference.<op>); MATH.md has the
equations.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import _C
from .. import _check as check
from .. import _kernels as K
from .. import _reference as R
from .._kernels import kernel
from .._library import custom_op, impl, no_grad_outputs, register_autograd, rowdot, stat
from .._reference import reference
from ._common import CACHE, PREPARE, library_names, norm_args, norm_cache, rows, same

_d = _C.desc

__all__ = ["rmsnorm_prepare", "linear_residual_rmsnorm", "rmsnorm_linear"]


# ---- public ops ------------------------------------------------------------------------------------------------------

@library_names(rmsnorm_prepare=PREPARE)
def rmsnorm_prepare(x, gamma, eps=1e-6):
    """First-layer norm without a GEMM before it: h = x * gamma, rstd = 1/sqrt(mean(x^2) + eps).

    x [..., d]; gamma [d] same dtype. Returns (h [..., d] same dtype, rstd [...] fp32), both non-differentiable: pass
    them as `cache` with (x, gamma) to rmsnorm_linear / rmsnorm_qkv_rope / linear_cross_entropy.
    """
    op = "rmsnorm_prepare"
    check.tensor(op, "x", x, floating=True)
    check.features(op, "x", x)
    check.tensor(op, "gamma", gamma, rank=1, floating=True)
    check.same_device(op, x=x, gamma=gamma)
    check.same_dtype(op, "x", x, gamma=gamma)
    check.size(op, "gamma", gamma, 0, x.shape[-1], "x's last dimension")
    check.positive(op, "eps", eps)
    h, rstd = rmsnorm_prepare_op(rows(x), gamma, float(eps))
    return h.reshape(x.shape), rstd.reshape(x.shape[:-1])


@library_names(linear_residual_rmsnorm=same("a", "w", "residual", "gamma", "eps"))
def linear_residual_rmsnorm(a, w, residual, gamma, eps=1e-6):
    """x = a w^T + residual, and the next RMSNorm's first half h = x * gamma, rstd = 1/sqrt(mean(x^2) + eps).

    a [..., k]; w [d, k]; residual [..., d]; gamma [d] (the next norm's weight); all one dtype.
    Returns (x [..., d], h [..., d], rstd [...] fp32). x is differentiable (to a, w, residual); h and rstd are the
    non-differentiable cache of (x, gamma) for the next op. One GEMM launch + one tiny reduce.
    """
    op = "linear_residual_rmsnorm"
    check.tensor(op, "a", a, floating=True)
    check.tensor(op, "w", w, rank=2, floating=True)
    check.tensor(op, "residual", residual, floating=True)
    check.tensor(op, "gamma", gamma, rank=1, floating=True)
    check.same_device(op, a=a, w=w, residual=residual, gamma=gamma)
    check.same_dtype(op, "a", a, w=w, residual=residual, gamma=gamma)
    check.features(op, "a", a)
    check.size(op, "w", w, 1, a.shape[-1], "a's last dimension")
    check.rows(op, "w", w, "output features d")
    check.features(op, "residual", residual)
    if residual.shape[:-1] != a.shape[:-1] or residual.shape[-1] != w.shape[0]:
        raise ValueError(f"coda.{op}: `residual` must have shape {(*a.shape[:-1], w.shape[0])}, got "
                         f"{tuple(residual.shape)}")
    check.size(op, "gamma", gamma, 0, w.shape[0], "w's first dimension")
    check.positive(op, "eps", eps)
    x, h, rstd = linear_residual_rmsnorm_op(rows(a), w, rows(residual), gamma, float(eps))
    out = (*a.shape[:-1], w.shape[0])
    return x.reshape(out), h.reshape(out), rstd.reshape(a.shape[:-1])


@library_names(rmsnorm_prepare=PREPARE, linear_rowscale={**CACHE, "w": "w"})
def rmsnorm_linear(x, gamma, w, eps=1e-6, *, cache=None):
    """y = rmsnorm(x) w^T = diag(rstd) (x * gamma) w^T, the normalisation applied as a row scale in the GEMM
    epilogue (linear_rowscale). Backward: one fused dgrad (linear_residual_rmsnorm_bwd) gives dx and dgamma;
    dW = dy^T a.

    x [..., d]; gamma [d]; w [n, d]; one dtype. Returns y [..., n]. Any n: on CUDA, n that is not a multiple of 8
    runs on a zero-padded copy of w (one weight-sized copy per call) and y is a view of the first n columns.
    """
    op = "rmsnorm_linear"
    norm_args(op, x, gamma, w, eps)
    x2 = rows(x)
    h, rstd = norm_cache(op, x, x2, gamma, float(eps), cache)
    n = w.shape[0]
    if x.is_cuda and n % 8:
        # The kernel stores y with TMA (rows of a multiple of 8 elements): run on w with zero rows up to the next
        # multiple of 8 and return the first n columns (a view). Autograd slices the padded rows' gradient away.
        y = rmsnorm_linear_op(x2, gamma, torch.nn.functional.pad(w, (0, 0, 0, -n % 8)), h, rstd)[:, :n]
    else:
        y = rmsnorm_linear_op(x2, gamma, w, h, rstd)
    return y.reshape(*x.shape[:-1], n)


# ---- custom ops and autograd -----------------------------------------------------------------------------------------

@custom_op("coda::rmsnorm_prepare", mutates_args=())
def rmsnorm_prepare_op(x: Tensor, gamma: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return impl(x).rmsnorm_prepare(x, gamma, eps)


@rmsnorm_prepare_op.register_fake
def _(x, gamma, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format), stat((x.shape[0],), x)


def _prepare_ctx(ctx, inputs, output):
    no_grad_outputs(ctx, *output)


register_autograd(rmsnorm_prepare_op, lambda ctx, dh, drstd: (None, None, None), _prepare_ctx)


@custom_op("coda::linear_residual_rmsnorm", mutates_args=())
def linear_residual_rmsnorm_op(a: Tensor, w: Tensor, residual: Tensor, gamma: Tensor,
                               eps: float) -> tuple[Tensor, Tensor, Tensor]:
    return impl(a).linear_residual_rmsnorm(a, w, residual, gamma, eps)


@linear_residual_rmsnorm_op.register_fake
def _(a, w, residual, gamma, eps):
    x = a.new_empty((a.shape[0], w.shape[0]))
    return x, torch.empty_like(x), stat((a.shape[0],), a)


def _linear_residual_rmsnorm_ctx(ctx, inputs, output):
    a, w, _, _, _ = inputs
    ctx.save_for_backward(a, w)
    no_grad_outputs(ctx, output[1], output[2])


def _linear_residual_rmsnorm_grad(ctx, dx, dh, drstd):
    a, w = ctx.saved_tensors
    if dx is None:
        return None, None, None, None, None
    dx = dx.contiguous()
    da = dx @ w if ctx.needs_input_grad[0] else None
    dw = dx.t() @ a if ctx.needs_input_grad[1] else None
    return da, dw, dx, None, None


register_autograd(linear_residual_rmsnorm_op, _linear_residual_rmsnorm_grad, _linear_residual_rmsnorm_ctx)


@custom_op("coda::linear_residual_rmsnorm_bwd", mutates_args=())
def linear_residual_rmsnorm_bwd_op(dz: Tensor, w: Tensor, x: Tensor, gamma: Tensor, rstd: Tensor, zdz: Tensor,
                                   dx_in: Optional[Tensor], alpha: float) -> tuple[Tensor, Tensor, Tensor]:
    return impl(x).linear_residual_rmsnorm_bwd(dz, w, x, gamma, rstd, zdz, dx_in, alpha)


@linear_residual_rmsnorm_bwd_op.register_fake
def _(dz, w, x, gamma, rstd, zdz, dx_in, alpha):
    dx = x.new_empty(x.shape)
    return dx, torch.empty_like(dx), stat((x.shape[1],), x)


def norm_linear_bwd(dz, zdz, x, gamma, w, rstd, dx_in=None):
    """linear_residual_rmsnorm_bwd then dW = dz^T a: the gradients of y = rmsnorm(x; gamma) w^T given dz (and zdz
    for it)."""
    dx, a, dgamma = linear_residual_rmsnorm_bwd_op(dz, w, x, gamma, rstd, zdz, dx_in, 1.0)
    dw = dz.t() @ a
    return dx, dgamma.to(gamma.dtype), dw


@custom_op("coda::rmsnorm_linear", mutates_args=())
def rmsnorm_linear_op(x: Tensor, gamma: Tensor, w: Tensor, h: Tensor, rstd: Tensor) -> Tensor:
    return impl(h).linear_rowscale(h, w, rstd)


@rmsnorm_linear_op.register_fake
def _(x, gamma, w, h, rstd):
    return h.new_empty((h.shape[0], w.shape[0]))


def _rmsnorm_linear_ctx(ctx, inputs, output):
    x, gamma, w, _, rstd = inputs
    ctx.save_for_backward(x, gamma, w, rstd, output)


def _rmsnorm_linear_bwd(ctx, dy):
    x, gamma, w, rstd, y = ctx.saved_tensors
    dy = dy.contiguous()
    dx, dgamma, dw = norm_linear_bwd(dy, rowdot(y, dy, x.shape[1]), x, gamma, w, rstd)
    return dx, dgamma, dw, None, None


register_autograd(rmsnorm_linear_op, _rmsnorm_linear_bwd, _rmsnorm_linear_ctx)


# ---- CUDA calls and float64 twins ------------------------------------------------------------------------------------

@kernel
def rmsnorm_prepare_cuda(x, gamma, eps):
    """First-layer norm: h = x gamma, rstd (linear_residual_rmsnorm's norm half without a GEMM). -> (h [M,d],
    rstd [M] fp32)."""
    h = torch.empty_like(x, memory_format=torch.contiguous_format)
    rstd = K.f32((x.shape[0],), x)
    _C.call("rmsnorm_prepare", _d(x), _d(gamma), eps, _d(h), _d(rstd), _C.stream(x.device))
    return h, rstd


@reference
def rmsnorm_prepare_f64(x, gamma, eps):
    x64 = R.f64(x)
    return (x64 * R.f64(gamma)).to(x.dtype), R.stat_like(R.rstd_of(x64, eps), x)


@kernel
def linear_residual_rmsnorm_cuda(a, w, residual, gamma, eps):
    """x = a w^T + residual, h = x gamma, rstd. -> (x, h, rstd)."""
    M, N = a.shape[0], w.shape[0]
    x = torch.empty((M, N), dtype=a.dtype, device=a.device)
    h = torch.empty_like(x)
    rstd = K.f32((M,), a)
    ws = K.workspace("linear_residual_rmsnorm", a.device, M, N)
    _C.call("linear_residual_rmsnorm", _d(a), _d(w), _d(residual), _d(gamma), eps, _d(x), _d(h), _d(rstd),
            ws.data_ptr(), ws.numel(), _C.stream(a.device))
    return x, h, rstd


@reference
def linear_residual_rmsnorm_f64(a, w, residual, gamma, eps):
    x64 = R.f64(a) @ R.f64(w).T + R.f64(residual)
    return x64.to(a.dtype), (x64 * R.f64(gamma)).to(a.dtype), R.stat_like(R.rstd_of(x64, eps), a)


@kernel
def linear_rowscale_cuda(h, w, rstd):
    """y = diag(rstd) h w^T."""
    M, N = h.shape[0], w.shape[0]
    y = torch.empty((M, N), dtype=h.dtype, device=h.device)
    ws = K.workspace("linear_rowscale", h.device, M, N)
    _C.call("linear_rowscale", _d(h), _d(w), _d(rstd), _d(y), ws.data_ptr(), ws.numel(), _C.stream(h.device))
    return y


@reference
def linear_rowscale_f64(h, w, rstd):
    return R.rowscale(h, w, rstd).to(h.dtype)


@kernel
def linear_residual_rmsnorm_bwd_cuda(dz, w, x, gamma, rstd, zdz, dx_in, alpha):
    """dx = dx_in + rstd (D gamma - alpha c zdz), a = c gamma, dgamma = sum D c; D = alpha dz w.
    -> (dx, a, dgamma fp32)."""
    M, N = x.shape
    dx = torch.empty((M, N), dtype=x.dtype, device=x.device)
    a = torch.empty_like(dx)
    dgamma = K.f32((N,), x)
    ws = K.workspace("linear_residual_rmsnorm_bwd", x.device, M, N)
    _C.call("linear_residual_rmsnorm_bwd", _d(dz), _d(w), _d(x), _d(gamma), _d(rstd), _d(zdz), _d(dx_in), alpha,
            _d(dx), _d(a), _d(dgamma), ws.data_ptr(), ws.numel(), _C.stream(x.device))
    return dx, a, dgamma


@reference
def linear_residual_rmsnorm_bwd_f64(dz, w, x, gamma, rstd, zdz, dx_in, alpha):
    D = alpha * (R.f64(dz) @ R.f64(w))
    dx, a, dgamma = R.norm_bwd(D, R.f64(x), R.f64(gamma), R.f64(rstd), alpha * R.f64(zdz))
    if dx_in is not None:
        dx = dx + R.f64(dx_in)
    return dx.to(x.dtype), a.to(x.dtype), R.stat_like(dgamma, x)
