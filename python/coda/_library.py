"""CODA's torch operators: the machinery of their torch.library custom_op definitions (namespace `coda`), their
fake (meta) kernels for torch.compile, their autograd formulas (register_autograd) and the eager fast path. The
operators themselves are defined in the op families (coda/ops/_<family>.py) with @custom_op; `_library.<name>` is
the eager caller of torch.ops.coda.<name>.

Each operator runs the CUDA kernels (_kernels, through the C ABI) on CUDA tensors and the float64 reference
(_reference) on CPU tensors: impl(t). Arguments are 2-D [tokens, features]; coda.ops flattens leading dimensions and
checks arguments before it calls these.

Autograd boundaries follow the fused backward kernels (MATH.md): an op that consumes a normalised input takes the
un-normalised x and gamma as its differentiable inputs plus (h = x gamma, rstd) as a forward-only cache, so its
backward is one linear_residual_rmsnorm_bwd call giving dx and dgamma directly. Cache outputs (h, rstd, z, ...) are
marked non-differentiable. What each backward saves is what MATH.md lists: x, rstd and the weights for
linear_residual_rmsnorm_bwd; z for linear_swiglu_bwd_zdz; the rotated qkv for rope_bwd_zdz; the block's
coda_block_saved tensors.
"""
from __future__ import annotations

import inspect

import torch
from torch import Tensor

from . import _kernels, _reference
from ._registry import Registry

# Every op is defined through custom_op, which records its eager caller (the fast path below), and gets its autograd
# formula through register_autograd, which also builds the caller's autograd.Function.
_OPS = Registry("coda op")  # op name -> its eager caller
__getattr__, __dir__ = _OPS.module_hooks(globals())


def custom_op(name: str, mutates_args=()):
    """torch.library.custom_op(`name`) of the decorated function; returns the op's eager caller (_eager), which
    carries the op as `.custom_op` and its `register_fake`."""
    def define(fn):
        short = name.split("::")[-1]
        _OPS.require_new(short, fn.__module__)  # before torch registers it
        op = torch.library.custom_op(name, mutates_args=mutates_args)(fn)
        return _OPS.add(short, _eager(short, op, fn, tuple(mutates_args)))
    return define


def register_autograd(caller, backward, setup_context):
    """The op's autograd formula, for the custom op and for its eager caller (an autograd.Function running the op's
    function with the same setup_context and backward)."""
    caller.custom_op.register_autograd(backward, setup_context=setup_context)
    fn = caller.function

    def forward(ctx, *args):
        out = fn(*args)
        setup_context(ctx, args, out)
        return out

    caller.autograd_function = type(f"{caller.__name__}_function", (torch.autograd.Function,),
                                    {"forward": staticmethod(forward), "backward": staticmethod(backward)})


def impl(t: Tensor):
    """The implementations for t's device: _kernels on CUDA, _reference elsewhere."""
    return _kernels if t.is_cuda else _reference


def stat_dtype(t: Tensor):
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def stat(shape, like: Tensor):
    return like.new_empty(shape, dtype=stat_dtype(like))


def no_grad_outputs(ctx, *outputs):
    ctx.mark_non_differentiable(*outputs)
    ctx.set_materialize_grads(False)


def rowdot(a: Tensor, b: Tensor, d: int) -> Tensor:
    """(1/d) sum_j a[m,j] b[m,j] in fp32 (float64 for float64 inputs): the zdz of a dgrad whose output was stored."""
    dt = stat_dtype(a)
    return (a.to(dt) * b.to(dt)).sum(-1) / d


# ---- the eager fast path ----------------------------------------------------------------------------------------
# A custom_op call costs ~0.1-0.2 ms of host time in eager mode (measured on the development VM with torch 2.15 for
# the 15-argument block forward; cProfile puts most of it in torch's per-call fill_defaults), and the GPU waits that
# long before the op's first kernel whenever the host is not ahead of it (profiles/block_llama3-8b_h200_2bd6ceb.txt:
# 0.77 ms idle before the block forward's first GEMM). Eagerly, on plain tensors and with no dispatch mode active,
# each op runs its function directly, inside a torch.autograd.Function with the same setup_context and backward when
# gradients are needed. Traced, fake and subclassed tensors (torch.compile, export, FakeTensorMode), keyword
# arguments and active dispatch modes take the custom op as before. Arguments an op mutates get the version bump
# the custom op gives them, so autograd's saved-tensor check still refuses a second backward through a block whose
# in-place backward overwrote z1.

try:
    from torch.utils._python_dispatch import _get_current_dispatch_mode as _dispatch_mode
except ImportError:  # unknown torch layout: always go through the custom op
    def _dispatch_mode():
        return True


def _tracing_or_transformed():
    """torch.jit.trace (it must record the op: on CUDA the kernels are ctypes calls it cannot see) or an active
    functorch transform (vmap, grad, jvp: the wrapped tensors look plain, and the kernels cannot take them)."""
    try:
        return torch._C._is_tracing() or torch._C._are_functorch_transforms_active()
    except AttributeError:  # unknown torch layout: go through the custom op
        return True


_PLAIN = (torch.Tensor, torch.nn.Parameter)  # a model's weights are Parameters; any other subclass may dispatch


def eager_plain(args) -> bool:
    """True when a call with these arguments runs plainly eager: not under torch.compile, no dispatch mode, no jit
    trace or functorch transform, every tensor argument a plain Tensor or Parameter. Then an op may take its fast
    path (its function directly) and ops.block may reuse its argument checks."""
    return not (torch.compiler.is_compiling() or _dispatch_mode() is not None or _tracing_or_transformed()
                or not all(type(a) in _PLAIN for a in args if isinstance(a, Tensor)))


def _eager(name: str, op, fn, mutated):
    params = list(inspect.signature(fn).parameters)
    mutated_at = tuple(params.index(m) for m in mutated)

    def call(*args, **kwargs):
        if kwargs or not eager_plain(args):
            return op(*args, **kwargs)
        wants_grad = torch.is_grad_enabled() and any(isinstance(a, Tensor) and a.requires_grad for a in args)
        if wants_grad:
            if call.autograd_function is None:  # no autograd formula: the custom op raises autograd's own error
                return op(*args)
            return call.autograd_function.apply(*args)
        out = fn(*args)
        for i in mutated_at:
            if args[i] is not None:
                torch.autograd.graph.increment_version(args[i])
        return out

    call.__name__ = call.__qualname__ = name
    call.__doc__ = fn.__doc__
    call.custom_op = op
    call.function = fn
    call.autograd_function = None  # set by register_autograd
    call.register_fake = op.register_fake
    return call
