"""Argument checks of the Python API, run before any kernel and before tracing: they name the argument and the
rule (TypeError for a wrong type or dtype, ValueError for a wrong shape, device or value). The C library checks
again (alignment, strides, aliasing, architecture) and its message is raised the same way."""
from __future__ import annotations

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


def size(op, name, t, dim, expected, what):
    if t.shape[dim] != expected:
        raise ValueError(f"coda.{op}: `{name}` dimension {dim} must equal {what} ({expected}), got shape "
                         f"{tuple(t.shape)}")


def number(op, name, v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"coda.{op}: `{name}` must be a number, got {type(v).__name__}")


def positive(op, name, v):
    number(op, name, v)
    if not v > 0:
        raise ValueError(f"coda.{op}: `{name}` must be > 0, got {v}")


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
