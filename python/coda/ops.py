"""CODA's functional API: the fused ops of a LLaMA block with autograd, traceable by torch.compile(fullgraph=True).

Conventions (every function):
  - Activations are [..., features]: leading dimensions (batch, sequence) are flattened to tokens and restored on the
    outputs. Weights use the nn.Linear layout [out_features, in_features], in CODA's order: gate/up interleaved
    (coda.layout.interleave_gate_up) and q/k rows RoPE-paired per head (coda.layout.pair_rope_rows); coda.nn and
    coda.patch_llama do this for you.
  - CUDA tensors run the sm_90 kernels: bfloat16 or float16 activations and weights (one dtype), fp32 statistics,
    input feature sizes (d, F) multiples of 8, any output size n and vocabulary V. CPU tensors run the float64
    PyTorch reference (any floating dtype; slow; for tests and debugging). Mixing devices is an error.
  - Normalised inputs: ops that start with an RMSNorm take the un-normalised x, its gamma and eps, and optionally
    `cache=(h, rstd)` where h = x * gamma and rstd = 1/sqrt(mean(x^2) + eps) came out of the op before
    (linear_residual_rmsnorm, swiglu_mlp, rmsnorm_prepare). The cache is a forward-only shortcut: gradients flow to x
    and gamma (one fused backward kernel, MATH.md's linear_residual_rmsnorm_bwd), never through h or rstd, which are
    non-differentiable.
  - Errors: TypeError / ValueError naming the argument and the rule, raised before any kernel runs; the library's
    own checks (alignment, strides, aliasing, GPU architecture) raise the same way with its rule, in the op's and
    its caller's names ("coda.swiglu_mlp: `w_down`: ... (checked by coda_linear_residual_rmsnorm)"). Feature
    sizes (d, F, the vocabulary, w's rows) must be > 0; zero tokens are fine. Targets and positions may have any
    layout.
Equation numbers refer to docs/MATH.md.
"""
from __future__ import annotations

import functools
import warnings

import torch

from . import _check as check
from . import _library as lib

__all__ = [
    "rmsnorm_prepare", "linear_residual_rmsnorm", "rmsnorm_linear", "rmsnorm_qkv_rope", "rmsnorm_qkv_qk_norm_rope",
    "swiglu_mlp", "block", "linear_cross_entropy", "cross_entropy",
]


def _rows(t, features=None):
    """[..., f] -> [tokens, f] (a view when possible)."""
    f = t.shape[-1] if features is None else features
    return t.reshape(-1, f)


def _norm_cache(op, x, x2d, gamma, eps, cache):
    """The (h [tokens, d], rstd [tokens]) of x2d = x flattened to rows: the caller's cache or a fresh one. The cache
    may have x's shape (h [..., d], rstd [...], as the ops return it, also for a slice x[:, -1:] of a cached x) or
    the flat one (h [tokens, d], rstd [tokens] or [tokens, 1])."""
    if cache is None:
        return lib.rmsnorm_prepare(x2d, gamma, eps)
    if not (isinstance(cache, (tuple, list)) and len(cache) == 2):
        raise TypeError(f"coda.{op}: `cache` must be a (h, rstd) pair, got {type(cache).__name__}")
    h, rstd = cache
    check.tensor(op, "cache[0] (h)", h, dtype=x2d.dtype)
    check.tensor(op, "cache[1] (rstd)", rstd, dtype=(torch.float32, torch.float64))
    check.same_device(op, x=x2d, **{"cache[0] (h)": h, "cache[1] (rstd)": rstd})
    M, d = x2d.shape
    lead = tuple(x.shape[:-1])
    h_ok = tuple(h.shape) in (tuple(x.shape), (M, d))
    rstd_ok = tuple(rstd.shape) in (lead, (M,), (M, 1))
    if not (h_ok and rstd_ok):
        raise ValueError(f"coda.{op}: `cache` must be (h, rstd) of x {tuple(x.shape)}: h {tuple(x.shape)} (or "
                         f"{(M, d)}) and rstd {lead} (or {(M,)}), got h {tuple(h.shape)}, rstd {tuple(rstd.shape)}")
    if h.requires_grad or rstd.requires_grad:
        raise ValueError(f"coda.{op}: `cache` tensors must not require grad: they are a forward-only shortcut of "
                         "(x, gamma), whose gradients the op computes")
    return h.reshape(M, d), rstd.reshape(M).contiguous()  # a slice rstd[:, -1:] is strided; the kernels read [M]


def _norm_args(op, x, gamma, w, eps, names=("x", "gamma", "w")):
    """The checks of an op that starts with an RMSNorm: x [..., d], gamma [d], a weight w [out, d] after it;
    `names` are the caller's names of (x, gamma, w) (block: x0, gamma1, w_gu)."""
    xn, gn, wn = names
    check.tensor(op, xn, x, floating=True)
    check.features(op, xn, x)
    check.tensor(op, gn, gamma, rank=1, floating=True)
    check.tensor(op, wn, w, rank=2, floating=True)
    check.same_device(op, **{xn: x, gn: gamma, wn: w})
    check.same_dtype(op, xn, x, **{gn: gamma, wn: w})
    check.size(op, gn, gamma, 0, x.shape[-1], f"{xn}'s last dimension")
    check.size(op, wn, w, 1, x.shape[-1], f"{xn}'s last dimension (nn.Linear layout [out, in])")
    check.rows(op, wn, w, "output features")
    check.positive(op, "eps", eps)


# ---- libcoda's errors in the caller's names ------------------------------------------------------------------
# libcoda checks again what only it can (alignment, strides, aliasing, devices) and names its own C parameters: the
# `w` of coda_linear_residual_rmsnorm is swiglu_mlp's w_down. Each public op is decorated with the C functions it
# calls (forward) and, per function, which of its caller's arguments each C parameter is; a library error inside
# the op then reads "coda.<op>: `<caller's argument>`: <rule> (checked by coda_<function>)" (_check.library_message),
# of the same exception type. Parameters not listed are the op's own temporaries and outputs (an error naming one
# is a CODA bug). Under torch.compile the checks of this file run while tracing; a library error raised when the
# compiled graph runs keeps the library's names.

def _same(*names):
    return {n: n for n in names}


_CACHE = {"h": "cache[0] (h)", "rstd": "cache[1] (rstd)"}  # h and rstd are only ever the caller's in a cache
_PREPARE = _same("x", "gamma", "eps")
_CE_OPTIONS = {f"options->{n}": n for n in ("ignore_index", "reduction", "label_smoothing", "z_loss", "softcap")}


def _library_names(**functions):
    """Decorator of a public op: `functions` maps each C function the op calls (coda_<name> without the prefix) to
    {C parameter: the caller's argument}."""
    def decorate(fn):
        op = fn.__name__

        @functools.wraps(fn)
        def public(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except (TypeError, ValueError, RuntimeError, NotImplementedError) as e:
                function = getattr(e, "coda_function", None)
                if function is None:
                    raise
                names = functions.get(function[len("coda_"):], {})
                error = type(e)(check.library_message(op, function, e.coda_message, names))
                error.coda_function, error.coda_message = function, e.coda_message
                raise error from None
        return public
    return decorate


@_library_names(rmsnorm_prepare=_PREPARE)
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
    h, rstd = lib.rmsnorm_prepare(_rows(x), gamma, float(eps))
    return h.reshape(x.shape), rstd.reshape(x.shape[:-1])


@_library_names(linear_residual_rmsnorm=_same("a", "w", "residual", "gamma", "eps"))
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
    x, h, rstd = lib.linear_residual_rmsnorm(_rows(a), w, _rows(residual), gamma, float(eps))
    out = (*a.shape[:-1], w.shape[0])
    return x.reshape(out), h.reshape(out), rstd.reshape(a.shape[:-1])


@_library_names(rmsnorm_prepare=_PREPARE, linear_rowscale={**_CACHE, "w": "w"})
def rmsnorm_linear(x, gamma, w, eps=1e-6, *, cache=None):
    """y = rmsnorm(x) w^T = diag(rstd) (x * gamma) w^T, the normalisation applied as a row scale in the GEMM
    epilogue (linear_rowscale). Backward: one fused dgrad (linear_residual_rmsnorm_bwd) gives dx and dgamma;
    dW = dy^T a.

    x [..., d]; gamma [d]; w [n, d]; one dtype. Returns y [..., n]. Any n: on CUDA, n that is not a multiple of 8
    runs on a zero-padded copy of w (one weight-sized copy per call) and y is a view of the first n columns.
    """
    op = "rmsnorm_linear"
    _norm_args(op, x, gamma, w, eps)
    x2 = _rows(x)
    h, rstd = _norm_cache(op, x, x2, gamma, float(eps), cache)
    n = w.shape[0]
    if x.is_cuda and n % 8:
        # The kernel stores y with TMA (rows of a multiple of 8 elements): run on w with zero rows up to the next
        # multiple of 8 and return the first n columns (a view). Autograd slices the padded rows' gradient away.
        y = lib.rmsnorm_linear(x2, gamma, torch.nn.functional.pad(w, (0, 0, 0, -n % 8)), h, rstd)[:, :n]
    else:
        y = lib.rmsnorm_linear(x2, gamma, w, h, rstd)
    return y.reshape(*x.shape[:-1], n)


def _qkv_rope_args(op, x, gamma, w_qkv, positions, inv_freq, n_q_heads, n_kv_heads, head_dim, eps):
    """The checks of a q/k/v projection with RoPE: the norm's and the GEMM's arguments, the heads, positions (one
    integer per token) and inv_freq [head_dim / 2]."""
    _norm_args(op, x, gamma, w_qkv, eps, ("x", "gamma", "w_qkv"))
    check.heads(op, w_qkv.shape[0], n_q_heads, n_kv_heads, head_dim)
    check.tensor(op, "positions", positions, dtype=(torch.int32, torch.int64))
    check.tensor(op, "inv_freq", inv_freq, rank=1, floating=True)
    check.same_device(op, x=x, positions=positions, inv_freq=inv_freq)
    check.size(op, "inv_freq", inv_freq, 0, head_dim // 2, "head_dim / 2")
    if positions.shape != x.shape[:-1]:
        raise ValueError(f"coda.{op}: `positions` must have shape {tuple(x.shape[:-1])} (one per token), got "
                         f"{tuple(positions.shape)}")


@_library_names(rmsnorm_prepare=_PREPARE, linear_rowscale_rope={
    **_CACHE, **_same("w_qkv", "positions", "inv_freq", "n_q_heads", "n_kv_heads", "head_dim")})
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
    x2 = _rows(x)
    h, rstd = _norm_cache(op, x, x2, gamma, float(eps), cache)
    pos = positions.reshape(-1).to(torch.int32)
    inv = inv_freq.to(torch.float32) if x.is_cuda else inv_freq
    qkv = lib.rmsnorm_qkv_rope(x2, gamma, w_qkv, h, rstd, pos, inv, int(n_q_heads), int(n_kv_heads),
                                int(head_dim))
    return qkv.reshape(*x.shape[:-1], w_qkv.shape[0])


@_library_names(rmsnorm_prepare=_PREPARE, linear_rowscale_qk_norm_rope={
    **_CACHE, **_same("w_qkv", "q_gamma", "k_gamma", "positions", "inv_freq", "n_q_heads", "n_kv_heads", "head_dim",
                      "qk_eps")})
def rmsnorm_qkv_qk_norm_rope(x, gamma, w_qkv, q_gamma, k_gamma, positions, inv_freq, n_q_heads, n_kv_heads,
                              head_dim, eps=1e-6, qk_eps=None, *, cache=None):
    """qkv = RoPE(qk_norm(rmsnorm(x) w_qkv^T)) (Qwen3 style; MATH.md "linear_rowscale_qk_norm_rope"),
    where qk_norm RMS-normalises each q head with q_gamma and each k head with k_gamma over its head_dim columns
    (epsilon qk_eps, default eps); v passes through.

    Arguments as rmsnorm_qkv_rope, plus q_gamma, k_gamma [head_dim] in the paired layout (coda.layout.pair_rope_rows
    applied to a [head_dim, 1] view of HF's q_norm / k_norm weight; the per-head mean does not depend on the order).
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
    x2 = _rows(x)
    h, rstd = _norm_cache(op, x, x2, gamma, float(eps), cache)
    pos = positions.reshape(-1).to(torch.int32)
    inv = inv_freq.to(torch.float32) if x.is_cuda else inv_freq
    qkv, _ = lib.rmsnorm_qkv_qk_norm_rope(x2, gamma, w_qkv, h, rstd, q_gamma, k_gamma, pos, inv, int(n_q_heads),
                                           int(n_kv_heads), int(head_dim), float(qk_eps))
    return qkv.reshape(*x.shape[:-1], w_qkv.shape[0])


@_library_names(rmsnorm_prepare=_PREPARE, linear_rowscale_swiglu={**_CACHE, "w_gu": "w_gu"},
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
    _norm_args(op, x, gamma, w_gu, eps, ("x", "gamma", "w_gu"))
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
    x2 = _rows(x)
    h, rstd = _norm_cache(op, x, x2, gamma, float(eps), cache)
    x_out, h_next, rstd_next, _ = lib.swiglu_mlp(x2, gamma, w_gu, w_down, h, rstd, next_gamma, float(eps))
    return x_out.reshape(x.shape), (h_next.reshape(x.shape), rstd_next.reshape(x.shape[:-1]))


@_library_names(block_forward={
    **_same("y0", "x0", "positions", "inv_freq", "eps"),
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
    x1, rstd1, z1, x2, rstd2, qkv, z = lib.block_forward(
        _rows(y0), _rows(x0), w_o, gamma1, w_gu, w_down, gamma2, w_qkv, pos, inv, int(n_q_heads), int(n_kv_heads),
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
    _norm_args(op, x0, gamma1, w_gu, eps, ("x0", "gamma1", "w_gu"))
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


def _ce_args(op, ignore_index, reduction, label_smoothing, z_loss, softcap):
    check.reduction(op, reduction)
    check.number(op, "label_smoothing", label_smoothing)
    check.number(op, "z_loss", z_loss)
    if softcap is not None:
        check.number(op, "softcap", softcap)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"coda.{op}: `label_smoothing` must be in [0, 1], got {label_smoothing}")
    if z_loss < 0:
        raise ValueError(f"coda.{op}: `z_loss` must be >= 0, got {z_loss}")
    if softcap is not None and softcap < 0:
        raise ValueError(f"coda.{op}: `softcap` must be >= 0 (0 or None: off), got {softcap}")
    return int(ignore_index), reduction, float(label_smoothing), float(z_loss), float(softcap or 0.0)


@_library_names(
    rmsnorm_prepare=_PREPARE,
    linear_cross_entropy={**_CACHE, **_same("w", "targets", "chunk_rows"), **_CE_OPTIONS},
    linear_cross_entropy_bwd={**_CACHE, **_same("w", "x", "gamma", "targets", "chunk_rows"), **_CE_OPTIONS})
def linear_cross_entropy(x, gamma, w, targets, eps=1e-6, *, cache=None, ignore_index=-100, reduction="mean",
                         label_smoothing=0.0, z_loss=0.0, softcap=None, chunk_rows=0):
    """Final RMSNorm + LM head + cross-entropy without the logits in memory (linear_rowscale_lse / cross_entropy
    and the chunked LM-head backward): l = rmsnorm(x; gamma) w^T, optionally softcapped, loss as
    torch.nn.functional.cross_entropy(l, targets, ignore_index, reduction, label_smoothing) plus z_loss * lse^2 per
    row.

    x [..., d]; gamma [d]; w [V, d] (any V); targets [...] int64/int32 (ignore_index rows give 0 loss
    and 0 gradient; mean averages over the other rows, and is 0 when every row is ignored, where torch gives NaN; a
    target outside [0, V) that is not ignore_index makes the loss NaN instead of raising, since raising would need a
    host synchronisation). Returns the loss: fp32 [] for mean/sum, [...] for none.
    chunk_rows: tokens per fused GEMM (0: the library's default). With gradients required and a mean/sum
    reduction, the forward computes the loss and the gradients in one chunked pass (logits, their gradient, dgrad
    and wgrad per chunk: 3 GEMMs of tokens x V x d) and the backward only scales them by the upstream gradient;
    otherwise the forward keeps row statistics only and the backward recomputes the logits chunk by chunk.
    """
    op = "linear_cross_entropy"
    _norm_args(op, x, gamma, w, eps)
    check.tensor(op, "targets", targets, dtype=(torch.int32, torch.int64))
    check.same_device(op, x=x, targets=targets)
    if targets.shape != x.shape[:-1]:
        raise ValueError(f"coda.{op}: `targets` must have shape {tuple(x.shape[:-1])} (one per token), got "
                         f"{tuple(targets.shape)}")
    if chunk_rows < 0:
        raise ValueError(f"coda.{op}: `chunk_rows` must be >= 0 (0: default), got {chunk_rows}")
    opts = _ce_args(op, ignore_index, reduction, label_smoothing, z_loss, softcap)
    x2 = _rows(x)
    h, rstd = _norm_cache(op, x, x2, gamma, float(eps), cache)
    if reduction != "none" and torch.is_grad_enabled() and any(t.requires_grad for t in (x, gamma, w)):
        # Training: loss and gradients in one pass (the gradients are scaled by the upstream gradient later).
        t = targets.reshape(-1)
        if reduction == "mean" and x.dtype == torch.float16:
            # fp16: the gradients of the sum (p - onehot per row, inside fp16's normal range), and the mean's 1/N
            # applied with the upstream gradient. Taken with 1/N in the one pass, the logits' gradients (~1/(N V))
            # fall below fp16's smallest normal before a loss scaler's factor could lift them: measured up to 6x
            # (loss scale 1) and 37x (4096) the unpatched model's gradient error (bench/results/fp16_gradients).
            loss = lib.linear_cross_entropy_train(x2, gamma, w, h, rstd, t, opts[0], "sum", *opts[2:],
                                                  int(chunk_rows))[0]
            return loss / (t != opts[0]).sum().clamp(min=1)
        return lib.linear_cross_entropy_train(x2, gamma, w, h, rstd, t, *opts, int(chunk_rows))[0]
    loss, _ = lib.linear_cross_entropy(x2, gamma, w, h, rstd, targets.reshape(-1), *opts, int(chunk_rows))
    return loss.reshape(x.shape[:-1]) if reduction == "none" else loss


@_library_names(cross_entropy={**_same("logits", "targets"), **_CE_OPTIONS})
def cross_entropy(logits, targets, *, ignore_index=-100, reduction="mean", label_smoothing=0.0, z_loss=0.0,
                  softcap=None):
    """Cross-entropy over stored logits (as torch.nn.functional.cross_entropy, plus z_loss and softcap).

    logits [..., V] bf16/fp16 (CUDA) or any float (CPU), any V and row stride (rows that are not 16-byte vectors
    take a slower scalar path); targets [...] int64/int32. Returns the fp32 loss ([] for mean/sum, [...] for none);
    finite for any finite logits (the row max is subtracted before any scaling). The backward recomputes the
    softmax from the logits (nothing [.., V] is saved besides the logits themselves).
    """
    op = "cross_entropy"
    check.tensor(op, "logits", logits, floating=True)
    check.features(op, "logits", logits)
    check.tensor(op, "targets", targets, dtype=(torch.int32, torch.int64))
    check.same_device(op, logits=logits, targets=targets)
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"coda.{op}: `targets` must have shape {tuple(logits.shape[:-1])}, got "
                         f"{tuple(targets.shape)}")
    opts = _ce_args(op, ignore_index, reduction, label_smoothing, z_loss, softcap)
    loss = lib.cross_entropy(_rows(logits), targets.reshape(-1), *opts)
    return loss.reshape(logits.shape[:-1]) if reduction == "none" else loss


def _renamed(new, old):
    """`old` (the name before the ops took the C ABI's spelling, `rmsnorm`) as a deprecated alias of `new`."""
    @functools.wraps(new)
    def alias(*args, **kwargs):
        warnings.warn(f"coda.ops.{old} is renamed coda.ops.{new.__name__}; the old name will be removed",
                      DeprecationWarning, stacklevel=2)
        return new(*args, **kwargs)
    alias.__name__ = alias.__qualname__ = old
    return alias


rms_norm_linear = _renamed(rmsnorm_linear, "rms_norm_linear")
rms_norm_qkv_rope = _renamed(rmsnorm_qkv_rope, "rms_norm_qkv_rope")
rms_norm_qkv_qk_norm_rope = _renamed(rmsnorm_qkv_qk_norm_rope, "rms_norm_qkv_qk_norm_rope")
