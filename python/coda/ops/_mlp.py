"""The SwiGLU MLP family: the gate/up GEMM with SwiGLU (linear_rowscale_swiglu), its dgrad with the SwiGLU backward
(linear_swiglu_bwd_zdz), and the MLP with its residual and the next norm's statistics (swiglu_mlp).

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
from ._common import CACHE, PREPARE, library_names, norm_args, norm_cache, rows
from ._norm import norm_linear_bwd

_d = _C.desc

__all__ = ["swiglu_mlp"]


# ---- public ops ------------------------------------------------------------------------------------------------------

@library_names(rmsnorm_prepare=PREPARE, linear_rowscale_swiglu={**CACHE, "w_gu": "w_gu"},
               linear_residual_rmsnorm={"w": "w_down", "residual": "x", "gamma": "next_gamma", "eps": "eps"})
def swiglu_mlp(x, gamma, w_gu, w_down, eps=1e-6, *, cache=None, next_gamma=None):
    """The SwiGLU MLP with its residual (linear_rowscale_swiglu + linear_residual_rmsnorm): z = rmsnorm(x) w_gu^T,
    y = silu(z_gate) z_up, x_out = x + y w_down^T; also the next norm's cache h_next = x_out * next_gamma, rstd_next.

    x [..., d]; gamma [d]; w_gu [2F, d] gate/up interleaved (coda.layout.interleave_gate_up); w_down [d, F];
    next_gamma [d] or None (no next norm: ones). Returns (x_out [..., d], (h_next, rstd_next)). Saves z [tokens, 2F]
    for the backward (linear_swiglu_bwd_zdz then linear_residual_rmsnorm_bwd); y and the normalised x are recomputed
    there, not stored.
    """
    op = "swiglu_mlp"
    norm_args(op, x, gamma, w_gu, eps, ("x", "gamma", "w_gu"))
    check.tensor(op, "w_down", w_down, rank=2, floating=True)
    check.tensor(op, "next_gamma", next_gamma, rank=1, floating=True, optional=True)
    check.same_device(op, x=x, w_down=w_down, next_gamma=next_gamma)
    check.same_dtype(op, "x", x, w_down=w_down, next_gamma=next_gamma)
    if w_gu.shape[0] % 2 or w_down.shape != (x.shape[-1], w_gu.shape[0] // 2):
        raise ValueError(f"coda.{op}: `w_down` must be [d, F] = {(x.shape[-1], w_gu.shape[0] // 2)} for w_gu "
                         f"[2F, d] = {tuple(w_gu.shape)}, got {tuple(w_down.shape)}")
    if next_gamma is None:
        next_gamma = torch.ones_like(gamma)
    check.size(op, "next_gamma", next_gamma, 0, x.shape[-1], "x's last dimension")
    x2 = rows(x)
    h, rstd = norm_cache(op, x, x2, gamma, float(eps), cache)
    x_out, h_next, rstd_next, _ = swiglu_mlp_op(x2, gamma, w_gu, w_down, h, rstd, next_gamma, float(eps))
    return x_out.reshape(x.shape), (h_next.reshape(x.shape), rstd_next.reshape(x.shape[:-1]))


# ---- custom ops and autograd -----------------------------------------------------------------------------------------

@custom_op("coda::linear_swiglu_bwd_zdz", mutates_args=())
def linear_swiglu_bwd_zdz_op(dx: Tensor, w_down: Tensor, z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return impl(dx).linear_swiglu_bwd_zdz(dx, w_down, z)


@linear_swiglu_bwd_zdz_op.register_fake
def _(dx, w_down, z):
    return z.new_empty(z.shape), dx.new_empty((dx.shape[0], w_down.shape[1])), stat((dx.shape[0],), dx)


@custom_op("coda::swiglu_mlp", mutates_args=())
def swiglu_mlp_op(x: Tensor, gamma: Tensor, w_gu: Tensor, w_down: Tensor, h: Tensor, rstd: Tensor, next_gamma: Tensor,
                  eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    fns = impl(h)
    z, y = fns.linear_rowscale_swiglu(h, w_gu, rstd)
    x_out, h_next, rstd_next = fns.linear_residual_rmsnorm(y, w_down, x, next_gamma, eps)
    return x_out, h_next, rstd_next, z


@swiglu_mlp_op.register_fake
def _(x, gamma, w_gu, w_down, h, rstd, next_gamma, eps):
    x_out = x.new_empty(x.shape)
    return x_out, torch.empty_like(x_out), stat((x.shape[0],), x), h.new_empty((h.shape[0], w_gu.shape[0]))


def _mlp_ctx(ctx, inputs, output):
    x, gamma, w_gu, w_down, _, rstd, _, _ = inputs
    ctx.save_for_backward(x, gamma, w_gu, w_down, rstd, output[3])
    no_grad_outputs(ctx, output[1], output[2], output[3])


def _mlp_bwd(ctx, dx_out, dh, drstd, dz_unused):
    x, gamma, w_gu, w_down, rstd, z = ctx.saved_tensors
    if dx_out is None:
        return (None,) * 8
    dx_out = dx_out.contiguous()
    dz, y, zdz = linear_swiglu_bwd_zdz_op(dx_out, w_down, z)
    dw_down = dx_out.t() @ y
    dx, dgamma, dw_gu = norm_linear_bwd(dz, zdz, x, gamma, w_gu, rstd, dx_in=dx_out)
    return dx, dgamma, dw_gu, dw_down, None, None, None, None


register_autograd(swiglu_mlp_op, _mlp_bwd, _mlp_ctx)


# ---- CUDA calls and float64 twins ------------------------------------------------------------------------------------

@kernel
def linear_rowscale_swiglu_cuda(h, w_gu, rstd):
    """z = diag(rstd) h w_gu^T [M,2F] (interleaved), y = silu(z even) z odd [M,F]. -> (z, y)."""
    M, N2 = h.shape[0], w_gu.shape[0]
    z = torch.empty((M, N2), dtype=h.dtype, device=h.device)
    y = torch.empty((M, N2 // 2), dtype=h.dtype, device=h.device)
    ws = K.workspace("linear_rowscale_swiglu", h.device, M, N2)
    _C.call("linear_rowscale_swiglu", _d(h), _d(w_gu), _d(rstd), _d(z), _d(y), ws.data_ptr(), ws.numel(),
            _C.stream(h.device))
    return z, y


@reference
def linear_rowscale_swiglu_f64(h, w_gu, rstd):
    z = R.rowscale(h, w_gu, rstd)
    y = torch.nn.functional.silu(z[:, 0::2]) * z[:, 1::2]
    return z.to(h.dtype), y.to(h.dtype)


@kernel
def linear_swiglu_bwd_zdz_cuda(dx, w_down, z, in_place=False):
    """dy = dx w_down, SwiGLU backward on z. -> (dz, y, zdz). in_place: dz overwrites z."""
    M, d = dx.shape
    F = w_down.shape[1]
    dz = z if in_place else torch.empty_like(z)
    y = torch.empty((M, F), dtype=dx.dtype, device=dx.device)
    zdz = K.f32((M,), dx)
    ws = K.workspace("linear_swiglu_bwd_zdz", dx.device, M, F)
    _C.call("linear_swiglu_bwd_zdz", _d(dx), _d(w_down), _d(z), _d(dz), _d(y), _d(zdz), ws.data_ptr(),
            ws.numel(), _C.stream(dx.device))
    return dz, y, zdz


def _swiglu_bwd(dy, z64):
    g, u = z64[:, 0::2], z64[:, 1::2]
    s = torch.sigmoid(g)
    dg = dy * u * s * (1 + g * (1 - s))
    du = dy * g * s
    return torch.stack((dg, du), dim=-1).reshape(z64.shape), g * s * u


@reference
def linear_swiglu_bwd_zdz_f64(dx, w_down, z, in_place=False):
    z64 = R.f64(z)
    dz, y = _swiglu_bwd(R.f64(dx) @ R.f64(w_down), z64)
    zdz = (z64 * dz).sum(-1) / dx.shape[1]
    dz_out = dz.to(z.dtype)
    if in_place:
        z.copy_(dz_out)
        dz_out = z
    return dz_out, y.to(dx.dtype), R.stat_like(zdz, dx)
