"""Functions by op name, filled by decorators in the op families (coda/ops/_<family>.py): each family module holds
an op's public function, its custom op, its CUDA call and its float64 twin, and registers the last two here, so that
coda._kernels / coda._reference find them by the C ABI's op name and a new op touches its family's file only."""
from __future__ import annotations

import importlib

FAMILIES = "coda.ops"  # the package whose import defines every op


class Registry:
    """`@registry` registers `<op><suffix>` under `<op>` (`add` under any name); `registry.get(op)` returns it (the
    families are imported on first use, so a lookup never depends on import order)."""

    def __init__(self, what: str, suffix: str = ""):
        self.what, self.suffix, self.functions = what, suffix, {}

    def __call__(self, fn):
        name = fn.__name__
        if not name.endswith(self.suffix) or len(name) == len(self.suffix):
            raise NameError(f"a {self.what} is named <op>{self.suffix}, got {name!r}")
        return self.add(name[: -len(self.suffix)], fn)

    def require_new(self, op: str, where: str):
        if op in self.functions:
            raise NameError(f"{self.what} {op!r} is registered twice ({where})")

    def add(self, op: str, fn):
        self.require_new(op, fn.__module__)
        self.functions[op] = fn
        return fn

    def module_hooks(self, module_globals: dict):
        """A module's `__getattr__` and `__dir__` serving the registered names as its attributes; a name found is
        cached as a module attribute, so the next lookup is a plain one (monkeypatching it works as usual)."""
        def getattr_(op):
            fn = module_globals[op] = self.get(module_globals["__name__"], op)
            return fn

        def dir_():
            return sorted(set(module_globals) | set(self.names()))
        return getattr_, dir_

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
