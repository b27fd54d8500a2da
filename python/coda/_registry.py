"""Functions by op name, filled by decorators in the op families (coda/ops/_<family>.py): each family module holds
an op's public function, its custom op, its CUDA call and its float64 twin, and registers the last two here, so that
coda._kernels / coda._reference find them by the C ABI's op name and a new op touches its family's file only."""
from __future__ import annotations

import importlib

FAMILIES = "coda.ops"  # the package whose import defines every op


class Registry:
    """`@registry` registers `<op><suffix>` under `<op>`; `registry.get(op)` returns it (the families are imported
    on first use, so a lookup never depends on import order)."""

    def __init__(self, what: str, suffix: str):
        self.what, self.suffix, self.functions = what, suffix, {}

    def __call__(self, fn):
        name = fn.__name__
        if not name.endswith(self.suffix) or len(name) == len(self.suffix):
            raise NameError(f"a {self.what} is named <op>{self.suffix}, got {name!r}")
        op = name[: -len(self.suffix)]
        if op in self.functions:
            raise NameError(f"{self.what} {op!r} is registered twice ({fn.__module__})")
        self.functions[op] = fn
        return fn

    def get(self, module: str, op: str):
        fn = self.functions.get(op)
        if fn is None:
            importlib.import_module(FAMILIES)  # registers every family's functions (a miss only: calls are hot)
            fn = self.functions.get(op)
        if fn is None:
            raise AttributeError(f"module {module!r} has no attribute {op!r} (no {self.what} of that name is "
                                 "registered)")
        return fn

    def names(self):
        importlib.import_module(FAMILIES)
        return sorted(self.functions)
