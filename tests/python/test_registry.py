"""The op families' registries (python/coda/ops/_<family>.py): what coda._kernels and coda._reference find by name."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import coda
from coda import _kernels, _library, _reference

FAMILIES = Path(coda.__file__).resolve().parent / "ops"
ONLY_CUDA = {"scale_cast"}  # a dtype conversion: the CPU path is torch.mul itself (ops/_loss.py _scaled_cast)
ONLY_F64 = {"qk_norm_rope", "qk_norm_rope_bwd"}  # float64 building blocks the tests use


def test_every_cuda_call_has_its_float64_twin():
    cuda, f64 = set(_kernels.kernel.names()), set(_reference.reference.names())
    assert len(cuda) >= 15
    assert cuda - f64 == ONLY_CUDA
    assert f64 - cuda == ONLY_F64


def test_every_impl_lookup_resolves_on_both_devices():
    """impl(t).<op> in a custom op picks _kernels on CUDA, _reference on the CPU: each such name must exist in both."""
    source = "".join(p.read_text(encoding="utf-8") for p in FAMILIES.glob("_*.py"))
    names = set(re.findall(r"\bimpl\(\w+\)\.(\w+)\(", source)) | set(re.findall(r"\bfns\.(\w+)\(", source))
    assert len(names) >= 10
    for name in sorted(names):
        assert callable(getattr(_kernels, name)) and callable(getattr(_reference, name)), name


def test_registered_names_follow_the_suffix_rule():
    for what, registry, suffix in (("CUDA call", _kernels.kernel, "_cuda"), ("float64 reference", _reference.reference,
                                                                           "_f64")):
        for op, fn in registry.functions.items():
            assert fn.__name__ == op + suffix and fn.__module__.startswith("coda.ops._"), (what, op)
    with pytest.raises(NameError, match="named <op>_cuda"):
        _kernels.kernel(lambda: None)
    with pytest.raises(NameError, match="registered twice"):
        def linear_rowscale_cuda():
            pass
        _kernels.kernel(linear_rowscale_cuda)


def test_unknown_names_raise_attribute_error():
    for module in (_kernels, _reference, _library):
        with pytest.raises(AttributeError, match="no_such_op"):
            getattr(module, "no_such_op")
        assert not hasattr(module, "no_such_op")


def test_every_torch_op_has_its_eager_caller():
    """@custom_op's caller carries the op; those with an autograd formula carry the eager fast path's Function."""
    ops = _library._OPS.functions
    assert {"rmsnorm_prepare", "linear_residual_rmsnorm", "block_forward", "cross_entropy"} <= set(ops)
    for name, caller in ops.items():
        assert caller.custom_op._qualname == f"coda::{name}", name
        assert getattr(_library, name) is caller
    assert _library.block_forward.autograd_function is not None
    assert _library.block_backward.autograd_function is None  # a backward: no formula of its own
