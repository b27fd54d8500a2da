"""libcoda's C entry points as plain functions on CUDA tensors: outputs allocated here (torch's caching allocator),
work on torch's current stream. One function per C entry point, same argument order and names, named after its op
in docs/MATH.md. Each is defined in its op family's module (coda/ops/_<family>.py) as `<op>_cuda` with @kernel and
read here as `_kernels.<op>`; _reference.<op> is its float64 twin for CPU tensors. The helpers the calls share live
in this file.

Every C call validates all of its arguments before it launches anything; a failure raises the exception that
_C.call maps the status to, with the library's message (argument name and rule).
"""
from __future__ import annotations

import torch

from . import _C
from ._registry import Registry

kernel = Registry("CUDA call", "_cuda")
__getattr__, __dir__ = kernel.module_hooks(globals())


def f32(shape, like):
    return torch.empty(shape, dtype=torch.float32, device=like.device)


def workspace(name, device, *size_args):
    """The scratch of C function coda_<name>, sized by coda_<name>_workspace_size(*size_args)."""
    return _C.workspace(_C.workspace_size(name, *size_args), device)


def dense(t):
    """The C ABI takes targets, positions and inv_freq as dense vectors; they are small ([tokens], [head_dim/2]), so
    a strided one (a slice, a transposed [batch, seq] grid flattened) is copied instead of refused."""
    return None if t is None else t.contiguous()


def float_pairs(t):
    """A [head_dim] gamma as the kernel reads it: fp32, contiguous, 8-byte aligned (float pairs); a copy if needed."""
    t = t.to(torch.float32).contiguous()
    return t if t.data_ptr() % 8 == 0 else t.clone()


def loss_shape(M, reduction):
    return (M,) if reduction == "none" else ()
