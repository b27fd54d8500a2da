"""What the public ops of every family share: flattening to rows, the first norm's cache and arguments, and
libcoda's errors in the caller's names (library_names)."""
from __future__ import annotations

import functools

import torch

from .. import _check as check
from .. import _library as lib


def rows(t, features=None):
    """[..., f] -> [tokens, f] (a view when possible)."""
    f = t.shape[-1] if features is None else features
    return t.reshape(-1, f)


def norm_cache(op, x, x2d, gamma, eps, cache):
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


def norm_args(op, x, gamma, w, eps, names=("x", "gamma", "w")):
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
# is a CODA bug). Under torch.compile the ops' checks run while tracing; a library error raised when the
# compiled graph runs keeps the library's names.

def same(*names):
    return {n: n for n in names}


CACHE = {"h": "cache[0] (h)", "rstd": "cache[1] (rstd)"}  # h and rstd are only ever the caller's in a cache
PREPARE = same("x", "gamma", "eps")
CE_OPTIONS = {f"options->{n}": n for n in ("ignore_index", "reduction", "label_smoothing", "z_loss", "softcap")}


def library_names(**functions):
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
