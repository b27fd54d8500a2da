"""The same functions as _kernels.py, for CPU tensors: docs/MATH.md computed in float64 with PyTorch, each output
rounded once to its dtype (the input's, fp32 for statistics). This is CODA's documented CPU path: any floating
dtype works (float64 in, float64 out: what gradcheck uses), and it is the semantics the CUDA kernels are tested
against. Slow by design (dense float64 math); it exists for correctness, CI without a GPU, and debugging.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _f64(t):
    return None if t is None else t.to(torch.float64)


def _rstd(x64, eps):
    return torch.rsqrt(x64.square().mean(-1) + eps)


def _stat(t):
    # Statistics are fp32 in the kernels; keep float64 when the caller works in float64 (gradcheck).
    return t.to(torch.float64) if t.dtype == torch.float64 else t.to(torch.float32)


def _stat_like(t, like):
    return t.to(torch.float64 if like.dtype == torch.float64 else torch.float32)


def rmsnorm_prepare(x, gamma, eps):
    x64 = _f64(x)
    return (x64 * _f64(gamma)).to(x.dtype), _stat_like(_rstd(x64, eps), x)


def linear_residual_rmsnorm(a, w, residual, gamma, eps):
    x64 = _f64(a) @ _f64(w).T + _f64(residual)
    return x64.to(a.dtype), (x64 * _f64(gamma)).to(a.dtype), _stat_like(_rstd(x64, eps), a)


def _rowscale(h, w, rstd):
    return _f64(rstd)[:, None] * (_f64(h) @ _f64(w).T)


def linear_rowscale(h, w, rstd):
    return _rowscale(h, w, rstd).to(h.dtype)


def linear_rowscale_swiglu(h, w_gu, rstd):
    z = _rowscale(h, w_gu, rstd)
    y = F.silu(z[:, 0::2]) * z[:, 1::2]
    return z.to(h.dtype), y.to(h.dtype)


def _rotate(z, positions, inv_freq, n_rot_heads, head_dim, sign):
    """Rotates the first n_rot_heads heads of z [M, W] (pairs adjacent) by sign * theta; float64."""
    M = z.shape[0]
    theta = positions.to(torch.float64)[:, None] * _f64(inv_freq)[None, :]  # [M, hd/2]
    cos, sin = torch.cos(theta)[:, None, :], sign * torch.sin(theta)[:, None, :]
    rot = z[:, : n_rot_heads * head_dim].reshape(M, n_rot_heads, head_dim // 2, 2)
    even, odd = rot[..., 0], rot[..., 1]
    out = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).reshape(M, n_rot_heads * head_dim)
    return torch.cat((out, z[:, n_rot_heads * head_dim:]), dim=1)


def linear_rowscale_rope(h, w_qkv, rstd, positions, inv_freq, n_q_heads, n_kv_heads, head_dim):
    z = _rowscale(h, w_qkv, rstd)
    return _rotate(z, positions, inv_freq, n_q_heads + n_kv_heads, head_dim, 1.0).to(h.dtype)


def qk_norm_rope(z, positions, inv_freq, q_gamma, k_gamma, eps, n_q_heads, n_kv_heads, head_dim):
    """linear_rowscale_qk_norm_rope after its GEMM (MATH.md): per-head RMSNorm of the q and k heads of z [M, W]
    (gammas [hd] in the paired layout), then RoPE; v passes through. float64 -> (qkv, head_rstd [M, Hq + Hkv])."""
    z64 = _f64(z)
    M, n_rot = z64.shape[0], n_q_heads + n_kv_heads
    u = z64[:, : n_rot * head_dim].reshape(M, n_rot, head_dim)
    r = torch.rsqrt(u.square().mean(dim=-1) + eps)  # [M, Hq + Hkv]
    g = torch.cat((_f64(q_gamma).expand(n_q_heads, head_dim), _f64(k_gamma).expand(n_kv_heads, head_dim)))
    n = torch.cat(((u * r[..., None] * g).reshape(M, n_rot * head_dim), z64[:, n_rot * head_dim:]), dim=1)
    return _rotate(n, positions, inv_freq, n_rot, head_dim, 1.0), r


def linear_rowscale_qk_norm_rope(h, w_qkv, rstd, q_gamma, k_gamma, positions, inv_freq, n_q_heads, n_kv_heads,
                                 head_dim, qk_eps, store_z=True):
    """-> (qkv, z), both from the float64 z = diag(rstd) h w_qkv^T, rounded once to h's dtype (z
    None with store_z=False)."""
    z = _rowscale(h, w_qkv, rstd)
    qkv, _ = qk_norm_rope(z, positions, inv_freq, q_gamma, k_gamma, qk_eps, n_q_heads, n_kv_heads, head_dim)
    return qkv.to(h.dtype), (z.to(h.dtype) if store_z else None)


def _ce(l64, targets, grad_loss, ignore_index, reduction, label_smoothing, z_loss, softcap, want_grad):
    """Cross-entropy on float64 logits. -> (loss, dl float64 or None, lse)."""
    M, V = l64.shape
    lc = softcap * torch.tanh(l64 / softcap) if softcap > 0 else l64
    # lse = mx + lse_rel, and the loss uses lse_rel + (mx - l): with a logit of 1e20, mx + log 2 would round to mx.
    mx = lc.amax(-1) if V > 0 else l64.new_zeros(M)
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    lse_rel = torch.logsumexp(lc - mx[:, None], dim=-1) if V > 0 else l64.new_zeros(M)
    lse = mx + lse_rel
    t = targets.to(torch.int64)
    ignored = t == ignore_index
    bad = ~ignored & ((t < 0) | (t >= V))
    safe_t = torch.where(ignored | bad, torch.zeros_like(t), t)
    lt = lc.gather(1, safe_t[:, None])[:, 0]
    per_row = ((1 - label_smoothing) * (lse_rel + (mx - lt)) + label_smoothing * (lse_rel + (mx - lc.mean(-1)))
               + z_loss * lse.square())
    per_row = torch.where(ignored, torch.zeros_like(per_row), per_row)
    per_row = torch.where(bad, torch.full_like(per_row, float("nan")), per_row)
    n_valid = int((~ignored).sum())
    if reduction == "none":
        loss = per_row
    elif reduction == "sum":
        loss = per_row.sum()
    else:
        loss = per_row.sum() / n_valid if n_valid > 0 else l64.new_zeros(())
    if not want_grad:
        return loss, None, lse
    g = l64.new_ones(()) if grad_loss is None else _f64(grad_loss)
    if reduction == "mean":
        g = g / max(n_valid, 1)
    g = g.expand(M) if g.dim() == 0 else g
    p = torch.softmax(lc, dim=-1)
    onehot = F.one_hot(safe_t, V).to(torch.float64)
    dlc = g[:, None] * (p - (1 - label_smoothing) * onehot - label_smoothing / V + 2 * z_loss * lse[:, None] * p)
    dl = dlc * (1 - torch.tanh(l64 / softcap).square()) if softcap > 0 else dlc
    dl = torch.where(ignored[:, None], torch.zeros_like(dl), dl)
    dl = torch.where(bad[:, None], torch.full_like(dl, float("nan")), dl)
    return loss, dl, lse


def cross_entropy(logits, targets, grad_loss, ignore_index, reduction, label_smoothing, z_loss, softcap,
                  hidden_size, want_grad):
    l64 = _f64(logits)
    loss, dl, _ = _ce(l64, targets, grad_loss, ignore_index, reduction, label_smoothing, z_loss, softcap, want_grad)
    if not want_grad:
        return _stat_like(loss, logits), None, None
    zdz = (l64 * dl).sum(-1) / hidden_size
    return _stat_like(loss, logits), dl.to(logits.dtype), _stat_like(zdz, logits)


def linear_cross_entropy(h, w, rstd, targets, ignore_index, reduction, label_smoothing, z_loss, softcap,
                         chunk_rows):
    loss, _, lse = _ce(_rowscale(h, w, rstd), targets, None, ignore_index, reduction, label_smoothing, z_loss,
                       softcap, False)
    return _stat_like(loss, h), _stat_like(lse, h)


def _norm_bwd(D, x64, gamma64, rstd64, zdz_scaled):
    """dx (without dx_in), a, dgamma of y = (x rstd gamma) W^T given D = dy W (float64)."""
    c = x64 * rstd64[:, None]
    dx = rstd64[:, None] * (D * gamma64 - c * zdz_scaled[:, None])
    return dx, c * gamma64, (D * c).sum(0)


def linear_cross_entropy_bwd(h, w, rstd, x, gamma, targets, grad_loss, ignore_index, reduction, label_smoothing,
                             z_loss, softcap, chunk_rows, want_loss=False):
    l64 = _rowscale(h, w, rstd)
    loss, dl, _ = _ce(l64, targets, grad_loss, ignore_index, reduction, label_smoothing, z_loss, softcap, True)
    d = h.shape[1]
    zdz = (l64 * dl).sum(-1) / d
    dx, a, dgamma = _norm_bwd(dl @ _f64(w), _f64(x), _f64(gamma), _f64(rstd), zdz)
    grads = (dx.to(x.dtype), _stat_like(dl.T @ a, h), _stat_like(dgamma, h))
    return grads + (_stat_like(loss, h),) if want_loss else grads


def rope_bwd_zdz(qkv, dqkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, hidden_size):
    dq64 = _f64(dqkv)
    dz = _rotate(dq64, positions, inv_freq, n_q_heads + n_kv_heads, head_dim, -1.0)
    zdz = (_f64(qkv) * dq64).sum(-1) / hidden_size
    return dz.to(dqkv.dtype), _stat_like(zdz, qkv)


def qk_norm_rope_bwd(z, qkv, dqkv, positions, inv_freq, q_gamma, k_gamma, eps, n_q_heads, n_kv_heads, head_dim,
                     hidden_size):
    """qk_norm_rope_bwd_zdz's math (MATH.md), float64: z the pre-norm input (the QKV GEMM's output), qkv the rotated
    output, dqkv its gradient. -> (dz, zdz, dq_gamma, dk_gamma); zdz from the head dots: (1/d)(sum_h eps r_h^2
    <dqkv_h, qkv_h> + <v, dv>)."""
    z64, y64, dy64 = _f64(z), _f64(qkv), _f64(dqkv)
    M, n_rot = z64.shape[0], n_q_heads + n_kv_heads
    W = n_rot * head_dim
    u = z64[:, :W].reshape(M, n_rot, head_dim)
    r = torch.rsqrt(u.square().mean(dim=-1) + eps)[..., None]  # [M, heads, 1]
    g = torch.cat((_f64(q_gamma).expand(n_q_heads, head_dim), _f64(k_gamma).expand(n_kv_heads, head_dim)))
    dn = _rotate(dy64, positions, inv_freq, n_rot, head_dim, -1.0)[:, :W].reshape(M, n_rot, head_dim)
    s = (dy64[:, :W] * y64[:, :W]).reshape(M, n_rot, head_dim).sum(-1, keepdim=True)  # <dn, n> = <dy, y>
    nh = u * r
    du = r * (g * dn - nh * s / head_dim)
    dz = torch.cat((du.reshape(M, W), dy64[:, W:]), dim=1)
    zdz = ((eps * r.square() * s).sum(dim=(1, 2)) + (z64[:, W:] * dy64[:, W:]).sum(-1)) / hidden_size
    dgamma = (dn * nh).sum(0)  # [heads, hd]
    return dz, zdz, dgamma[:n_q_heads].sum(0), dgamma[n_q_heads:].sum(0)


def qk_norm_rope_bwd_zdz(z, dqkv, q_gamma, k_gamma, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, qk_eps,
                         hidden_size):
    """coda_qk_norm_rope_bwd_zdz's outputs from qk_norm_rope_bwd (float64): (dz in z's dtype, zdz, dq_gamma,
    dk_gamma), the statistics in _stat's dtype."""
    qkv, _ = qk_norm_rope(z, positions, inv_freq, q_gamma, k_gamma, qk_eps, n_q_heads, n_kv_heads, head_dim)
    dz, zdz, dq, dk = qk_norm_rope_bwd(z, qkv, dqkv, positions, inv_freq, q_gamma, k_gamma, qk_eps, n_q_heads,
                                       n_kv_heads, head_dim, hidden_size)
    return dz.to(z.dtype), _stat_like(zdz, z), _stat_like(dq, z), _stat_like(dk, z)


def linear_residual_rmsnorm_bwd(dz, w, x, gamma, rstd, zdz, dx_in, alpha):
    D = alpha * (_f64(dz) @ _f64(w))
    dx, a, dgamma = _norm_bwd(D, _f64(x), _f64(gamma), _f64(rstd), alpha * _f64(zdz))
    if dx_in is not None:
        dx = dx + _f64(dx_in)
    return dx.to(x.dtype), a.to(x.dtype), _stat_like(dgamma, x)


def _swiglu_bwd(dy, z64):
    g, u = z64[:, 0::2], z64[:, 1::2]
    s = torch.sigmoid(g)
    dg = dy * u * s * (1 + g * (1 - s))
    du = dy * g * s
    return torch.stack((dg, du), dim=-1).reshape(z64.shape), g * s * u


def linear_swiglu_bwd_zdz(dx, w_down, z, in_place=False):
    z64 = _f64(z)
    dz, y = _swiglu_bwd(_f64(dx) @ _f64(w_down), z64)
    zdz = (z64 * dz).sum(-1) / dx.shape[1]
    dz_out = dz.to(z.dtype)
    if in_place:
        z.copy_(dz_out)
        dz_out = z
    return dz_out, y.to(dx.dtype), _stat_like(zdz, dx)


def block_forward(y0, x0, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads,
                  head_dim, eps, q_gamma=None, k_gamma=None, qk_eps=0.0):
    x1, h1, rstd1 = linear_residual_rmsnorm(y0, w_o, x0, gamma1, eps)
    z1, y1 = linear_rowscale_swiglu(h1, w_gu, rstd1)
    x2, h2, rstd2 = linear_residual_rmsnorm(y1, w_down, x1, gamma2, eps)
    if q_gamma is not None:
        qkv, z = linear_rowscale_qk_norm_rope(h2, w_qkv, rstd2, q_gamma, k_gamma, positions, inv_freq, n_q_heads,
                                              n_kv_heads, head_dim, qk_eps)
        return x1, rstd1, z1, x2, rstd2, qkv, z
    qkv = linear_rowscale_rope(h2, w_qkv, rstd2, positions, inv_freq, n_q_heads, n_kv_heads, head_dim)
    return x1, rstd1, z1, x2, rstd2, qkv, None


def block_backward(y0, positions, inv_freq, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, x1, rstd1, z1, x2, rstd2,
                   qkv, dqkv, dx2, n_q_heads, n_kv_heads, head_dim, eps, z=None, q_gamma=None, k_gamma=None,
                   qk_eps=0.0):
    d = x1.shape[1]
    dgq = dgk = None
    if q_gamma is not None:
        dz_qkv, zdz2, dgq, dgk = qk_norm_rope_bwd_zdz(z, dqkv, q_gamma, k_gamma, positions, inv_freq, n_q_heads,
                                                       n_kv_heads, head_dim, qk_eps, d)
    else:
        dz_qkv, zdz2 = rope_bwd_zdz(qkv, dqkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, d)
    dqkv.copy_(dz_qkv)  # as the kernel: dqkv becomes dz of the q/k/v projection
    dx2_total, a2, dgamma2 = linear_residual_rmsnorm_bwd(dz_qkv, w_qkv, x2, gamma2, rstd2, zdz2, dx2, 1.0)
    dw_qkv = (_f64(dz_qkv).T @ _f64(a2)).to(w_qkv.dtype)
    dz1, y1, zdz1 = linear_swiglu_bwd_zdz(dx2_total, w_down, z1, in_place=True)
    dw_down = (_f64(dx2_total).T @ _f64(y1)).to(w_down.dtype)
    dx1, a1, dgamma1 = linear_residual_rmsnorm_bwd(dz1, w_gu, x1, gamma1, rstd1, zdz1, dx2_total, 1.0)
    dw_gu = (_f64(dz1).T @ _f64(a1)).to(w_gu.dtype)
    dy0 = (_f64(dx1) @ _f64(w_o)).to(y0.dtype)
    dw_o = (_f64(dx1).T @ _f64(y0)).to(w_o.dtype)
    return dy0, dx1, dw_o, dgamma1, dw_gu, dw_down, dgamma2, dw_qkv, dgq, dgk
