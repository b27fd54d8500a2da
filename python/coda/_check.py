"""Argument checks of the Python API, run before any kernel and before tracing: they name the argument and the
rule (TypeError for a wrong type or dtype, ValueError for a wrong shape, device or value). The C library checks
again (alignment, strides, aliasing, architecture) and its message is raised the same way, in the public op's and
its caller's names (library_message; coda/ops/_common.py library_names)."""
from __future__ import annotations

import math

import re

import torch

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
KERNEL_DTYPES = (torch.bfloat16, torch.float16)
REDUCTIONS = ("mean", "sum", "none")


def tensor(op, name, t, *, rank=None, dtype=None, floating=False, optional=False):
    if t is None and optional:
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"coda.{op}: `{name}` must be a torch.Tensor, got {type(t).__name__}")
    if rank is not None and t.dim() not in (rank if isinstance(rank, tuple) else (rank,)):
        raise ValueError(f"coda.{op}: `{name}` must have rank {rank}, got shape {tuple(t.shape)}")
    if dtype is not None and t.dtype not in (dtype if isinstance(dtype, tuple) else (dtype,)):
        raise TypeError(f"coda.{op}: `{name}` must have dtype {dtype}, got {t.dtype}")
    if floating and t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"coda.{op}: `{name}` must be floating point, got {t.dtype}")


def same_dtype(op, ref_name, ref, **others):
    for name, t in others.items():
        if t is not None and t.dtype != ref.dtype:
            raise TypeError(f"coda.{op}: `{name}` has dtype {t.dtype} but `{ref_name}` has {ref.dtype}: they must "
                            "match (cast the weights to the activations' dtype)")


def same_device(op, **tensors):
    items = [(n, t) for n, t in tensors.items() if t is not None]
    dev = items[0][1].device
    for name, t in items[1:]:
        if t.device != dev:
            raise ValueError(f"coda.{op}: `{name}` is on {t.device} but `{items[0][0]}` is on {dev}: all tensors "
                             "must be on one device")
    if dev.type == "cuda":
        if items[0][1].dtype in FLOAT_DTYPES and items[0][1].dtype not in KERNEL_DTYPES:
            raise TypeError(f"coda.{op}: CUDA kernels take bfloat16 or float16 activations, `{items[0][0]}` is "
                            f"{items[0][1].dtype} (float32/float64 run only on the CPU reference path)")
    elif dev.type != "cpu":
        raise ValueError(f"coda.{op}: tensors on {dev} are not supported (CUDA sm_90, or CPU for the reference)")


def features(op, name, t):
    """t is [..., f] with f > 0: the kernels need K, N > 0, and an RMSNorm over no features is 0/0. Zero tokens
    (leading dimensions of size 0) are fine."""
    if t.dim() < 1:
        raise ValueError(f"coda.{op}: `{name}` must have a feature dimension ([..., features]), got a 0-dim tensor")
    if t.shape[-1] == 0:
        raise ValueError(f"coda.{op}: `{name}` must have at least one feature (last dimension > 0), got shape "
                         f"{tuple(t.shape)}")


def rows(op, name, w, what):
    """A weight [out, in] with out > 0 (the kernels need N > 0; `what` says what the rows are)."""
    if w.shape[0] == 0:
        raise ValueError(f"coda.{op}: `{name}` must have at least one row ({what}), got shape {tuple(w.shape)}")


def size(op, name, t, dim, expected, what):
    if t.shape[dim] != expected:
        raise ValueError(f"coda.{op}: `{name}` dimension {dim} must equal {what} ({expected}), got shape "
                         f"{tuple(t.shape)}")


def number(op, name, v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"coda.{op}: `{name}` must be a number, got {type(v).__name__}")


def positive(op, name, v):
    number(op, name, v)
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"coda.{op}: `{name}` must be > 0 and finite, got {v}")


def nonnegative(op, name, v, note=""):
    """A finite number >= 0 (the library's rule for z_loss and softcap; NaN and inf refused on every device)."""
    number(op, name, v)
    if not (v >= 0 and math.isfinite(v)):
        raise ValueError(f"coda.{op}: `{name}` must be >= 0 and finite{note}, got {v}")


def reduction(op, r):
    if r not in REDUCTIONS:
        raise ValueError(f"coda.{op}: `reduction` must be one of {REDUCTIONS}, got {r!r}")


def heads(op, width, n_q_heads, n_kv_heads, head_dim):
    if head_dim not in (64, 128):
        raise ValueError(f"coda.{op}: `head_dim` must be 64 or 128, got {head_dim}")
    if n_q_heads < 1 or n_kv_heads < 1 or n_q_heads % n_kv_heads:
        raise ValueError(f"coda.{op}: `n_kv_heads` ({n_kv_heads}) must be >= 1 and divide `n_q_heads` "
                         f"({n_q_heads})")
    if width != (n_q_heads + 2 * n_kv_heads) * head_dim:
        raise ValueError(f"coda.{op}: `w_qkv` must have (n_q_heads + 2 n_kv_heads) head_dim = "
                         f"{(n_q_heads + 2 * n_kv_heads) * head_dim} rows, got {width}")


# ---- libcoda's errors in the caller's names ------------------------------------------------------------------
# libcoda names its C parameters ("w: ...", "x_out and residual partially overlap", "... as given by h.sizes[1]",
# "weights.w_down: ...", "options->z_loss: ..."). Those names stand where the messages put a parameter: first, after
# "match ", "given by ", " and ", "but ", "requires " or ", ", and before ".sizes[".
_PARAM = r"[A-Za-z_]\w*(?:(?:\.|->)(?!sizes\[)[A-Za-z_]\w*)*"
_PARAM_AT = re.compile(rf"(?:^|(?<=match )|(?<=given by )|(?<= and )|(?<=but )|(?<=requires )|(?<=, ))({_PARAM})"
                       rf"(?=[\s:,().]|$)|\b([A-Za-z_]\w*)(?=\.sizes\[)")


def library_message(op, function, message, names):
    """libcoda's `message` from C `function`, as public op `op` reports it: "coda.<op>: <message> (checked by
    <function>)" with each C parameter in `names` ({C parameter: the caller's argument}) written as the caller's
    `argument` (X.sizes[i] as `argument`.shape[i]). Parameters not in `names` are the op's own temporaries and
    outputs and keep the library's name; so does the message of a failed inner step of a composite C call
    ("step ... failed: coda_<inner>: ..."), which names the inner function's parameters."""
    head, sep, inner = message.partition(" failed: coda_")

    def caller(m):
        name = names.get(m.group(1) or m.group(2))
        return m.group(0) if name is None else f"`{name}`"

    head = _PARAM_AT.sub(caller, head).replace("`.sizes[", "`.shape[")
    return f"coda.{op}: {head}{sep}{inner} (checked by {function})"
