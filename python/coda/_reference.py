"""The float64 twins of _kernels' functions, for CPU tensors: docs/MATH.md computed in float64 with PyTorch, each
output rounded once to its dtype (the input's, fp32 for statistics). This is CODA's documented CPU path: any
floating dtype works (float64 in, float64 out: what gradcheck uses), and it is the semantics the CUDA kernels are
tested against. Slow by design (dense float64 math); it exists for correctness, CI without a GPU, and debugging.

Each twin is defined beside its CUDA call in the op family's module (coda/ops/_<family>.py) as `<op>_f64` with
@reference and read here as `_reference.<op>` (so are two float64 building blocks the tests use: qk_norm_rope, the
QK-norm + RoPE after the GEMM, and qk_norm_rope_bwd, its backward); the float64 math the twins share lives in this
file.
"""
from __future__ import annotations

import torch

from ._registry import Registry

reference = Registry("float64 reference", "_f64")
__getattr__, __dir__ = reference.module_hooks(globals())


def f64(t):
    return None if t is None else t.to(torch.float64)


def rstd_of(x64, eps):
    """1 / sqrt(mean(x^2) + eps) per row, float64."""
    return torch.rsqrt(x64.square().mean(-1) + eps)


def stat_like(t, like):
    """A statistic in the kernels' dtype (fp32), or float64 when the caller works in float64 (gradcheck)."""
    return t.to(torch.float64 if like.dtype == torch.float64 else torch.float32)


def rowscale(h, w, rstd):
    """diag(rstd) h w^T in float64."""
    return f64(rstd)[:, None] * (f64(h) @ f64(w).T)


def rotate(z, positions, inv_freq, n_rot_heads, head_dim, sign):
    """Rotates the first n_rot_heads heads of z [M, W] (pairs adjacent) by sign * theta; float64."""
    M = z.shape[0]
    theta = positions.to(torch.float64)[:, None] * f64(inv_freq)[None, :]  # [M, hd/2]
    cos, sin = torch.cos(theta)[:, None, :], sign * torch.sin(theta)[:, None, :]
    rot = z[:, : n_rot_heads * head_dim].reshape(M, n_rot_heads, head_dim // 2, 2)
    even, odd = rot[..., 0], rot[..., 1]
    out = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).reshape(M, n_rot_heads * head_dim)
    return torch.cat((out, z[:, n_rot_heads * head_dim:]), dim=1)


def norm_bwd(D, x64, gamma64, rstd64, zdz_scaled):
    """dx (without dx_in), a, dgamma of y = (x rstd gamma) W^T given D = dy W (float64)."""
    c = x64 * rstd64[:, None]
    dx = rstd64[:, None] * (D * gamma64 - c * zdz_scaled[:, None])
    return dx, c * gamma64, (D * c).sum(0)
