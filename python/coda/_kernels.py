"""The C ABI's ops as plain functions on CUDA tensors: outputs allocated here (torch's caching allocator), work on
torch's current stream. One function per C entry point, same argument order and names; each is named after its op
in docs/MATH.md. _reference.py has the same functions for CPU tensors (float64 math).

Every C call validates all of its arguments before it launches anything; a failure raises the exception that
_C.call maps the status to, with the library's message (argument name and rule).
"""
from __future__ import annotations

import torch

from . import _C

_d = _C.desc


def _f32(shape, like):
    return torch.empty(shape, dtype=torch.float32, device=like.device)


def _ws(name, device, *size_args):
    return _C.workspace(_C.workspace_size(name, *size_args), device)


def _dense(t):
    """The C ABI takes targets, positions and inv_freq as dense vectors; they are small ([tokens], [head_dim/2]), so
    a strided one (a slice, a transposed [batch, seq] grid flattened) is copied instead of refused."""
    return None if t is None else t.contiguous()


def rmsnorm_prepare(x, gamma, eps):
    """First-layer norm: h = x gamma, rstd (linear_residual_rmsnorm's norm half without a GEMM). -> (h [M,d],
    rstd [M] fp32)."""
    h = torch.empty_like(x, memory_format=torch.contiguous_format)
    rstd = _f32((x.shape[0],), x)
    _C.call("rmsnorm_prepare", _d(x), _d(gamma), eps, _d(h), _d(rstd), _C.stream(x.device))
    return h, rstd


def linear_residual_rmsnorm(a, w, residual, gamma, eps):
    """x = a w^T + residual, h = x gamma, rstd. -> (x, h, rstd)."""
    M, N = a.shape[0], w.shape[0]
    x = torch.empty((M, N), dtype=a.dtype, device=a.device)
    h = torch.empty_like(x)
    rstd = _f32((M,), a)
    ws = _ws("linear_residual_rmsnorm", a.device, M, N)
    _C.call("linear_residual_rmsnorm", _d(a), _d(w), _d(residual), _d(gamma), eps, _d(x), _d(h), _d(rstd),
            ws.data_ptr(), ws.numel(), _C.stream(a.device))
    return x, h, rstd


def linear_rowscale(h, w, rstd):
    """y = diag(rstd) h w^T."""
    M, N = h.shape[0], w.shape[0]
    y = torch.empty((M, N), dtype=h.dtype, device=h.device)
    ws = _ws("linear_rowscale", h.device, M, N)
    _C.call("linear_rowscale", _d(h), _d(w), _d(rstd), _d(y), ws.data_ptr(), ws.numel(), _C.stream(h.device))
    return y


def linear_rowscale_swiglu(h, w_gu, rstd):
    """z = diag(rstd) h w_gu^T [M,2F] (interleaved), y = silu(z even) z odd [M,F]. -> (z, y)."""
    M, N2 = h.shape[0], w_gu.shape[0]
    z = torch.empty((M, N2), dtype=h.dtype, device=h.device)
    y = torch.empty((M, N2 // 2), dtype=h.dtype, device=h.device)
    ws = _ws("linear_rowscale_swiglu", h.device, M, N2)
    _C.call("linear_rowscale_swiglu", _d(h), _d(w_gu), _d(rstd), _d(z), _d(y), ws.data_ptr(), ws.numel(),
            _C.stream(h.device))
    return z, y


def linear_rowscale_rope(h, w_qkv, rstd, positions, inv_freq, n_q_heads, n_kv_heads, head_dim):
    """qkv = RoPE(diag(rstd) h w_qkv^T), q/k pairs adjacent."""
    M, N = h.shape[0], w_qkv.shape[0]
    positions, inv_freq = _dense(positions), _dense(inv_freq)
    qkv = torch.empty((M, N), dtype=h.dtype, device=h.device)
    ws = _ws("linear_rowscale_rope", h.device, M, N)
    _C.call("linear_rowscale_rope", _d(h), _d(w_qkv), _d(rstd), _d(positions), _d(inv_freq), n_q_heads,
            n_kv_heads, head_dim, _d(qkv), ws.data_ptr(), ws.numel(), _C.stream(h.device))
    return qkv


def _float_pairs(t):
    """A [head_dim] gamma as the kernel reads it: fp32, contiguous, 8-byte aligned (float pairs); a copy if needed."""
    t = t.to(torch.float32).contiguous()
    return t if t.data_ptr() % 8 == 0 else t.clone()


def linear_rowscale_qk_norm_rope(h, w_qkv, rstd, q_gamma, k_gamma, positions, inv_freq, n_q_heads, n_kv_heads,
                                 head_dim, qk_eps, store_z=True):
    """qkv = RoPE(qk_norm(diag(rstd) h w_qkv^T)) and z = diag(rstd) h w_qkv^T. -> (qkv, z); z is
    None with store_z=False (the kernel skips its store: forward only)."""
    M, N = h.shape[0], w_qkv.shape[0]
    positions, inv_freq = _dense(positions), _dense(inv_freq)
    q_gamma, k_gamma = _float_pairs(q_gamma), _float_pairs(k_gamma)
    qkv = torch.empty((M, N), dtype=h.dtype, device=h.device)
    z = torch.empty((M, N), dtype=h.dtype, device=h.device) if store_z else None
    _C.call("linear_rowscale_qk_norm_rope", _d(h), _d(w_qkv), _d(rstd), _d(q_gamma), _d(k_gamma), _d(positions),
            _d(inv_freq), n_q_heads, n_kv_heads, head_dim, qk_eps, _d(qkv), _d(z), _C.stream(h.device))
    return qkv, z


def _loss_shape(M, reduction):
    return (M,) if reduction == "none" else ()


def cross_entropy(logits, targets, grad_loss, ignore_index, reduction, label_smoothing, z_loss, softcap,
                  hidden_size, want_grad):
    """Cross-entropy over stored logits. -> (loss, dlogits or None, zdz or None)."""
    M, V = logits.shape
    targets = _dense(targets)
    loss = _f32(_loss_shape(M, reduction), logits)
    dlogits = torch.empty_like(logits) if want_grad else None
    zdz = _f32((M,), logits) if want_grad else None
    ws = _ws("cross_entropy", logits.device, M, V)
    opts = _C.ce_options(ignore_index, reduction, label_smoothing, z_loss, softcap)
    _C.call("cross_entropy", _d(logits), _d(targets), opts, _d(grad_loss), hidden_size, _d(loss), _d(dlogits),
            _d(zdz), ws.data_ptr(), ws.numel(), _C.stream(logits.device))
    return loss, dlogits, zdz


def linear_cross_entropy(h, w, rstd, targets, ignore_index, reduction, label_smoothing, z_loss, softcap,
                         chunk_rows):
    """LM head + loss without logits in memory (linear_rowscale_lse + cross_entropy statistics). -> (loss, lse [M])."""
    M, V = h.shape[0], w.shape[0]
    targets = _dense(targets)
    loss = _f32(_loss_shape(M, reduction), h)
    lse = _f32((M,), h)
    ws = _ws("linear_cross_entropy", h.device, M, V, chunk_rows)
    opts = _C.ce_options(ignore_index, reduction, label_smoothing, z_loss, softcap)
    _C.call("linear_cross_entropy", _d(h), _d(w), _d(rstd), _d(targets), opts, chunk_rows, _d(loss), _d(lse),
            ws.data_ptr(), ws.numel(), _C.stream(h.device))
    return loss, lse


def linear_cross_entropy_bwd(h, w, rstd, x, gamma, targets, grad_loss, ignore_index, reduction, label_smoothing,
                             z_loss, softcap, chunk_rows, want_loss=False):
    """Backward of the LM head + loss and the final norm (chunked linear_rowscale -> cross_entropy ->
    linear_residual_rmsnorm_bwd -> dW). -> (dx, dw fp32, dgamma fp32), plus the loss from the same pass when
    want_loss (a training step without a forward call)."""
    M, d = h.shape
    V = w.shape[0]
    targets = _dense(targets)
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    dw = torch.empty((V, d), dtype=torch.float32, device=h.device)
    dgamma = _f32((d,), h)
    ws = _ws("linear_cross_entropy_bwd", h.device, M, V, d, chunk_rows)
    opts = _C.ce_options(ignore_index, reduction, label_smoothing, z_loss, softcap)
    loss = _f32(_loss_shape(M, reduction), h) if want_loss else None
    _C.call("linear_cross_entropy_bwd", _d(h), _d(w), _d(rstd), _d(x), _d(gamma), _d(targets), opts,
            _d(grad_loss), chunk_rows, None, _d(dx), _d(dw), _d(dgamma), _d(loss), ws.data_ptr(), ws.numel(),
            _C.stream(h.device))
    return (dx, dw, dgamma, loss) if want_loss else (dx, dw, dgamma)


def scale_cast(src, scale, dtype):
    """out = R(src * scale) into `dtype` (bf16/fp16), the product in fp32, one rounding (the same bits as
    torch.mul(src, scale, out=out)); src fp32 contiguous, scale an fp32 one-element tensor read on the device.
    -> out, src's shape."""
    out = torch.empty(src.shape, dtype=dtype, device=src.device)
    _C.call("scale_cast", _d(src), _d(scale), _d(out), _C.stream(src.device))
    return out


def rope_bwd_zdz(qkv, dqkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, hidden_size):
    """dz = R(-theta) dqkv, zdz = (1/d) sum qkv dqkv. -> (dz, zdz)."""
    positions, inv_freq = _dense(positions), _dense(inv_freq)
    dz = torch.empty_like(dqkv, memory_format=torch.contiguous_format)
    zdz = _f32((qkv.shape[0],), qkv)
    _C.call("rope_bwd_zdz", _d(qkv), _d(dqkv), _d(positions), _d(inv_freq), n_q_heads, n_kv_heads, head_dim,
            hidden_size, _d(dz), _d(zdz), _C.stream(qkv.device))
    return dz, zdz


def qk_norm_rope_bwd_zdz(z, dqkv, q_gamma, k_gamma, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, qk_eps,
                         hidden_size):
    """The QK-norm + RoPE backward from the pre-norm z: -> (dz, zdz, dq_gamma fp32, dk_gamma fp32)."""
    positions, inv_freq = _dense(positions), _dense(inv_freq)
    q_gamma, k_gamma = q_gamma.to(torch.float32).contiguous(), k_gamma.to(torch.float32).contiguous()
    M = z.shape[0]
    dz = torch.empty_like(dqkv, memory_format=torch.contiguous_format)
    zdz = _f32((M,), z)
    dq_gamma, dk_gamma = _f32((head_dim,), z), _f32((head_dim,), z)
    ws = _ws("qk_norm_rope_bwd_zdz", z.device, M, head_dim)
    _C.call("qk_norm_rope_bwd_zdz", _d(z), _d(dqkv), _d(q_gamma), _d(k_gamma), _d(positions), _d(inv_freq),
            n_q_heads, n_kv_heads, head_dim, qk_eps, hidden_size, _d(dz), _d(zdz), _d(dq_gamma), _d(dk_gamma),
            ws.data_ptr(), ws.numel(), _C.stream(z.device))
    return dz, zdz, dq_gamma, dk_gamma


def linear_residual_rmsnorm_bwd(dz, w, x, gamma, rstd, zdz, dx_in, alpha):
    """dx = dx_in + rstd (D gamma - alpha c zdz), a = c gamma, dgamma = sum D c; D = alpha dz w.
    -> (dx, a, dgamma fp32)."""
    M, N = x.shape
    dx = torch.empty((M, N), dtype=x.dtype, device=x.device)
    a = torch.empty_like(dx)
    dgamma = _f32((N,), x)
    ws = _ws("linear_residual_rmsnorm_bwd", x.device, M, N)
    _C.call("linear_residual_rmsnorm_bwd", _d(dz), _d(w), _d(x), _d(gamma), _d(rstd), _d(zdz), _d(dx_in), alpha,
            _d(dx), _d(a), _d(dgamma), ws.data_ptr(), ws.numel(), _C.stream(x.device))
    return dx, a, dgamma


def linear_swiglu_bwd_zdz(dx, w_down, z, in_place=False):
    """dy = dx w_down, SwiGLU backward on z. -> (dz, y, zdz). in_place: dz overwrites z."""
    M, d = dx.shape
    F = w_down.shape[1]
    dz = z if in_place else torch.empty_like(z)
    y = torch.empty((M, F), dtype=dx.dtype, device=dx.device)
    zdz = _f32((M,), dx)
    ws = _ws("linear_swiglu_bwd_zdz", dx.device, M, F)
    _C.call("linear_swiglu_bwd_zdz", _d(dx), _d(w_down), _d(z), _d(dz), _d(y), _d(zdz), ws.data_ptr(),
            ws.numel(), _C.stream(dx.device))
    return dz, y, zdz


def _block_config(d, F, hq, hkv, hd, eps, qk_eps=0.0):
    c = _C.BlockConfig()
    c.hidden_size, c.intermediate_size = d, F
    c.n_q_heads, c.n_kv_heads, c.head_dim, c.eps, c.qk_eps = hq, hkv, hd, eps, qk_eps
    return c


def _block_weights(w_o, gamma1, w_gu, w_down, gamma2, w_qkv, q_gamma=None, k_gamma=None):
    """The weights struct; q_gamma / k_gamma as the kernel reads them (_float_pairs), converted by the caller, which
    keeps them alive until the C call: the struct holds their pointers only."""
    return _C.tensors(_C.BlockWeights, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, q_gamma, k_gamma)


def _qk_gammas(q_gamma, k_gamma):
    return (None, None) if q_gamma is None else (_float_pairs(q_gamma), _float_pairs(k_gamma))


def block_forward(y0, x0, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads,
                  head_dim, eps, q_gamma=None, k_gamma=None, qk_eps=0.0):
    """The CODA block forward (linear_residual_rmsnorm, linear_rowscale_swiglu, linear_residual_rmsnorm,
    linear_rowscale_rope; with q_gamma / k_gamma linear_rowscale_qk_norm_rope). -> (x1, rstd1, z1, x2, rstd2, qkv,
    z): the saved tensors; z (the pre-norm q/k/v projection) None without the QK-norm."""
    M, d = x0.shape
    F = w_down.shape[1]
    dev, dt = x0.device, x0.dtype
    positions, inv_freq = _dense(positions), _dense(inv_freq)
    x1 = torch.empty((M, d), dtype=dt, device=dev)
    z1 = torch.empty((M, 2 * F), dtype=dt, device=dev)
    x2 = torch.empty_like(x1)
    qkv = torch.empty((M, w_qkv.shape[0]), dtype=dt, device=dev)
    z = torch.empty_like(qkv) if q_gamma is not None else None
    q_gamma, k_gamma = _qk_gammas(q_gamma, k_gamma)
    rstd1, rstd2 = _f32((M,), x0), _f32((M,), x0)
    cfg = _block_config(d, F, n_q_heads, n_kv_heads, head_dim, eps, qk_eps if q_gamma is not None else 0.0)
    saved = _C.tensors(_C.BlockSaved, x1, rstd1, z1, x2, rstd2, qkv, z)
    ws = _C.workspace(_C.library().coda_block_forward_workspace_size(cfg, M), dev)
    _C.call("block_forward", cfg, _block_weights(w_o, gamma1, w_gu, w_down, gamma2, w_qkv, q_gamma, k_gamma),
            _d(y0), _d(x0), _d(positions), _d(inv_freq), saved, ws.data_ptr(), ws.numel(), _C.stream(dev))
    return x1, rstd1, z1, x2, rstd2, qkv, z


def block_backward(y0, positions, inv_freq, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, x1, rstd1, z1, x2, rstd2,
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
    positions, inv_freq = _dense(positions), _dense(inv_freq)
    dy0 = torch.empty_like(y0, memory_format=torch.contiguous_format)
    dx0 = torch.empty((M, d), dtype=dt, device=dev)
    dws = [torch.empty(w.shape, dtype=w.dtype, device=dev) for w in (w_o, w_gu, w_down, w_qkv)]
    dg1, dg2 = _f32((d,), x1), _f32((d,), x1)
    dgq, dgk = (_f32((head_dim,), x1), _f32((head_dim,), x1)) if qk else (None, None)
    grads = _C.tensors(_C.BlockGrads, dws[0], dg1, dws[1], dws[2], dg2, dws[3], dgq, dgk)
    cfg = _block_config(d, F, n_q_heads, n_kv_heads, head_dim, eps, qk_eps if qk else 0.0)
    saved = _C.tensors(_C.BlockSaved, x1, rstd1, z1, x2, rstd2, qkv, z if qk else None)
    ws = _C.workspace(_C.library().coda_block_backward_workspace_size(cfg, M), dev)
    _C.call("block_backward", cfg, _block_weights(w_o, gamma1, w_gu, w_down, gamma2, w_qkv, q_gamma, k_gamma),
            _d(y0), _d(positions), _d(inv_freq), saved, _d(dqkv), _d(dx2), _d(dy0), _d(dx0), grads, ws.data_ptr(),
            ws.numel(), _C.stream(dev))
    return dy0, dx0, dws[0], dg1, dws[1], dws[2], dg2, dws[3], dgq, dgk
