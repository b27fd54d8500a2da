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

Layout: one module per op family (_norm, _qkv, _mlp, _block, _loss), each holding its ops' public functions, custom
ops with autograd, CUDA calls and float64 twins; a family's `__all__` is what this package exports.
"""
from __future__ import annotations

import functools
import warnings

from . import _block, _loss, _mlp, _norm, _qkv
from ._block import *  # noqa: F401,F403
from ._loss import *  # noqa: F401,F403
from ._mlp import *  # noqa: F401,F403
from ._norm import *  # noqa: F401,F403
from ._qkv import *  # noqa: F401,F403

__all__ = [*_norm.__all__, *_qkv.__all__, *_mlp.__all__, *_block.__all__, *_loss.__all__]


def _renamed(new, old):
    """`old` (the name before the ops took the C ABI's spelling, `rmsnorm`) as a deprecated alias of `new`."""
    @functools.wraps(new)
    def alias(*args, **kwargs):
        warnings.warn(f"coda.ops.{old} is renamed coda.ops.{new.__name__}; the old name will be removed",
                      DeprecationWarning, stacklevel=2)
        return new(*args, **kwargs)
    alias.__name__ = alias.__qualname__ = old
    return alias


rms_norm_linear = _renamed(_norm.rmsnorm_linear, "rms_norm_linear")
rms_norm_qkv_rope = _renamed(_qkv.rmsnorm_qkv_rope, "rms_norm_qkv_rope")
rms_norm_qkv_qk_norm_rope = _renamed(_qkv.rmsnorm_qkv_qk_norm_rope, "rms_norm_qkv_qk_norm_rope")
