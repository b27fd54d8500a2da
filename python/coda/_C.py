"""ctypes binding of libcoda's C ABI (include/coda/coda.h, include/coda/block.h).

No compilation against torch: the library is loaded with ctypes, so one build works with any torch version.
Tensors are described to C with their data pointer, dtype, sizes and strides (in elements); outputs and workspaces
come from torch's caching allocator; work goes on torch's current CUDA stream.

The library is found, in order, at $CODA_LIBRARY, next to this file (the installed package), or in the build
folder of a source checkout (build/src/libcoda.so).
"""
from __future__ import annotations

import ctypes
import os
import re
import struct
from pathlib import Path

import torch

MAX_RANK = 4

# coda_status (types.h): the exception each one becomes in Python.
_STATUS_EXCEPTION = {
    1: ValueError,     # CODA_ERROR_INVALID_ARGUMENT
    2: TypeError,      # CODA_ERROR_DTYPE
    3: ValueError,     # CODA_ERROR_SHAPE
    4: ValueError,     # CODA_ERROR_LAYOUT
    5: ValueError,     # CODA_ERROR_MISALIGNED
    6: ValueError,     # CODA_ERROR_DEVICE
    7: ValueError,     # CODA_ERROR_ALIASING
    8: RuntimeError,   # CODA_ERROR_WORKSPACE (a bug here: the workspace is sized by the library)
    9: RuntimeError,   # CODA_ERROR_ARCH
    10: NotImplementedError,
    11: RuntimeError,  # CODA_ERROR_CUDA
    12: RuntimeError,  # CODA_ERROR_INTERNAL
}

DTYPE = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2, torch.int32: 3, torch.int64: 4}
REDUCTION = {"none": 0, "mean": 1, "sum": 2}


class Tensor(ctypes.Structure):
    """coda_tensor."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("rank", ctypes.c_int32),
        ("sizes", ctypes.c_int64 * MAX_RANK),
        ("strides", ctypes.c_int64 * MAX_RANK),
        ("device", ctypes.c_int32),
    ]


class CeOptions(ctypes.Structure):
    """coda_ce_options."""

    _fields_ = [
        ("ignore_index", ctypes.c_int64),
        ("reduction", ctypes.c_int),
        ("label_smoothing", ctypes.c_float),
        ("z_loss", ctypes.c_float),
        ("softcap", ctypes.c_float),
    ]


class _Versioned(ctypes.Structure):
    """A block struct: struct_size (block.h "Versioning") is set to the struct's size on construction. Fields by
    keyword only: positionally the first would be struct_size."""

    def __init__(self, **fields):
        super().__init__(**fields)
        self.struct_size = ctypes.sizeof(self)


class BlockConfig(_Versioned):
    """coda_block_config."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("hidden_size", ctypes.c_int64),
        ("intermediate_size", ctypes.c_int64),
        ("n_q_heads", ctypes.c_int32),
        ("n_kv_heads", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("eps", ctypes.c_float),
        ("qk_eps", ctypes.c_float),  # version 2: > 0 with a QK-norm
        ("reserved", ctypes.c_uint32),  # 0
    ]


# coda_tensor packed in one call: struct.pack + from_buffer_copy took about half the time of building the ctypes
# structure field by field (2.0 vs 3.9 us per tensor on the development VM). That is host time of every op call; a
# block call describes 16 tensors. The layout is checked against the ctypes declaration at import.
_TENSOR = struct.Struct("=Qii4q4qi4x")
_SIZE = struct.Struct("=Q")  # a block struct's leading struct_size (size_t: 64-bit on the platforms CODA runs on)
_PAD = tuple((0,) * (MAX_RANK - n) for n in range(MAX_RANK + 1))
assert _TENSOR.size == ctypes.sizeof(Tensor) and [getattr(Tensor, f).offset for f, _ in Tensor._fields_] == [
    0, 8, 12, 16, 48, 80], "coda_tensor's ctypes layout changed: update _TENSOR"


def _tensor_fields(*names):
    return [("struct_size", ctypes.c_size_t)] + [(n, Tensor) for n in names]


# block.h version 2: the QK-norm fields last (unset: all zero).
class BlockWeights(_Versioned):
    _fields_ = _tensor_fields("w_o", "gamma1", "w_gu", "w_down", "gamma2", "w_qkv", "q_gamma", "k_gamma")


class BlockGrads(_Versioned):
    _fields_ = _tensor_fields("w_o", "gamma1", "w_gu", "w_down", "gamma2", "w_qkv", "q_gamma", "k_gamma")


class BlockSaved(_Versioned):
    _fields_ = _tensor_fields("x1", "rstd1", "z1", "x2", "rstd2", "qkv", "z")


_T = ctypes.POINTER(Tensor)

# The C types of the ABI's parameters and results (const and spaces removed) and the ctypes type each is declared
# with. A header change that brings a new type fails at load, naming the function (tests/python/test_abi_signatures.py
# checks the headers without a library).
CTYPES = {
    "void": None, "coda_status": ctypes.c_int, "int": ctypes.c_int, "coda_dtype": ctypes.c_int,
    "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64, "size_t": ctypes.c_size_t, "float": ctypes.c_float,
    "constchar*": ctypes.c_char_p, "void*": ctypes.c_void_p, "constvoid*": ctypes.c_void_p,
    "int*": ctypes.POINTER(ctypes.c_int),
    "coda_tensor*": _T, "constcoda_tensor*": _T,
    "coda_ce_options": CeOptions, "constcoda_ce_options*": ctypes.POINTER(CeOptions),
    "constcoda_block_config*": ctypes.POINTER(BlockConfig), "constcoda_block_weights*": ctypes.POINTER(BlockWeights),
    "constcoda_block_saved*": ctypes.POINTER(BlockSaved), "coda_block_saved*": ctypes.POINTER(BlockSaved),
    "coda_block_grads*": ctypes.POINTER(BlockGrads),
}


def declarations(text: str) -> dict:
    """{name: (result type, [parameter types])} of every CODA_API function in C header text, each type without its
    parameter name, const and spaces removed ("constcoda_tensor*"), in CTYPES's spelling."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    out = {}
    for result, name, params in re.findall(r"CODA_API\s+([\w\s*]+?)\s*\b(coda_\w+)\s*\(([^)]*)\)\s*;", text):
        types = []
        for param in params.split(","):
            param = " ".join(param.split())
            if param in ("", "void"):
                continue
            if not param.endswith("*"):
                param = re.sub(r"\s*\b\w+$", "", param)  # the parameter's name
            types.append(param.replace(" ", ""))
        out[name] = ("".join(result.split()), types)
    return out


def _ctype(function: str, c_type: str, what: str):
    try:
        return CTYPES[c_type]
    except KeyError:
        raise RuntimeError(f"coda: {function}: {what} has the C type {c_type!r}, which coda/_C.py's CTYPES does not "
                           "map") from None


_lib = None
_load_error = None


def _candidates():
    env = os.environ.get("CODA_LIBRARY")
    if env:
        yield Path(env)
    here = Path(__file__).resolve().parent
    yield from sorted(here.glob("libcoda.so*"))
    root = here.parent.parent  # python/coda -> repository root
    build = Path(os.environ.get("CODA_BUILD_DIR", root / "build"))
    yield from sorted((build / "src").glob("libcoda.so*")) or [build / "src" / "libcoda.so"]


def library():
    """The loaded libcoda (ctypes.CDLL). Raises RuntimeError saying where it looked when it cannot be loaded."""
    global _lib, _load_error
    if _lib is not None:
        return _lib
    if _load_error is not None:
        raise RuntimeError(_load_error)
    tried = []
    for path in _candidates():
        if not path.exists():
            tried.append(f"{path} (missing)")
            continue
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        if not hasattr(lib, "coda_abi_declarations"):
            tried.append(f"{path} (built from an older checkout without coda_abi_declarations: rebuild it)")
            continue
        try:
            _declare(lib)
        except (RuntimeError, AttributeError) as e:  # a C type _C.py cannot declare: the load fails, saying why
            tried.append(f"{path} ({e})")
            continue
        _lib = lib
        return lib
    _load_error = ("coda: libcoda could not be loaded; tried: " + "; ".join(tried) +
                   ". Install the package (pip install .), build the checkout (tools/build), or set CODA_LIBRARY.")
    raise RuntimeError(_load_error)


def available() -> bool:
    """Whether libcoda can be loaded (it builds and loads without a GPU; running kernels needs sm_90)."""
    try:
        library()
        return True
    except RuntimeError:
        return False


def _declare(lib):
    """Declares every C function of the library (result and parameter types, so that ctypes checks the argument count
    and converts each argument) from the header text the library was built with (coda_abi_declarations)."""
    lib.coda_abi_declarations.restype = ctypes.c_char_p
    lib.coda_abi_declarations.argtypes = []
    for name, (result, params) in declarations(lib.coda_abi_declarations().decode()).items():
        fn = getattr(lib, name)
        fn.restype = _ctype(name, result, "the result")
        fn.argtypes = [_ctype(name, p, f"parameter {i}") for i, p in enumerate(params)]


def call(name: str, *args) -> None:
    """Calls coda_<name>(*args); a non-zero status raises the matching Python exception with the library's message
    (it names the argument and the rule; nothing was launched or written)."""
    status = getattr(library(), "coda_" + name)(*args)
    if status != 0:
        raise error(status, name, library().coda_last_error().decode(errors="replace"))


def error(status: int, name: str, message: str) -> Exception:
    """The exception of a failed coda_<name> call: the status's type (_STATUS_EXCEPTION), "coda_<name>: <message>".
    The library's message starts with the C function's name already, which is not repeated. The parts stay apart
    for coda.ops, which names its caller's arguments instead of the C parameters (ops._common.library_names):
    .coda_function ("coda_<name>") and .coda_message (what follows it: "<parameter>: <rule>")."""
    function = "coda_" + name
    if message.startswith(function + ": "):
        message = message[len(function) + 2:]
    e = _STATUS_EXCEPTION.get(status, RuntimeError)(f"{function}: {message}")
    e.coda_function, e.coda_message = function, message
    return e


def workspace_size(name: str, *args) -> int:
    return int(getattr(library(), f"coda_{name}_workspace_size")(*args))


def _packed(t: torch.Tensor) -> bytes:
    """The bytes of t's coda_tensor (data pointer NULL for an empty tensor; device -1 on the CPU)."""
    dtype = DTYPE.get(t.dtype)
    if dtype is None:
        raise TypeError(f"coda: dtype {t.dtype} is not one CODA kernels take (bfloat16, float16, float32, int32, "
                        "int64)")
    shape = t.shape
    rank = len(shape)
    if rank > MAX_RANK:
        raise ValueError(f"coda: a tensor of rank {rank} (at most {MAX_RANK})")
    pad = _PAD[rank]
    return _TENSOR.pack(t.data_ptr() if t.numel() > 0 else 0, dtype, rank, *shape, *pad, *t.stride(), *pad,
                        t.get_device())


def desc(t: torch.Tensor | None):
    """A coda_tensor (by reference) for a torch tensor, or None (NULL) for None."""
    if t is None:
        return None
    return ctypes.byref(Tensor.from_buffer_copy(_packed(t)))


_UNSET = bytes(ctypes.sizeof(Tensor))  # a coda_tensor field left unset (block.h: zero)


def tensors(cls, *ts: torch.Tensor | None):
    """One of the block structs (BlockWeights, BlockGrads, BlockSaved: struct_size, then coda_tensor fields), filled
    from ts in field order; None leaves a field unset (a QK-norm field without QK-norm)."""
    if len(ts) != len(cls._fields_) - 1:
        raise TypeError(f"coda: {cls.__name__} takes {len(cls._fields_) - 1} tensors, got {len(ts)}")
    return cls.from_buffer_copy(_SIZE.pack(ctypes.sizeof(cls)) +
                                b"".join(_UNSET if t is None else _packed(t) for t in ts))


def ce_options(ignore_index: int, reduction: str, label_smoothing: float, z_loss: float, softcap: float):
    opts = CeOptions()
    opts.ignore_index = ignore_index
    opts.reduction = REDUCTION[reduction]
    opts.label_smoothing = label_smoothing
    opts.z_loss = z_loss
    opts.softcap = softcap
    return ctypes.byref(opts)


def stream(device: torch.device):
    return ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)


def workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    """Scratch memory from torch's caching allocator (256-byte aligned or better)."""
    return torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device=device)


def device_supported(index: int = -1) -> bool:
    """Whether CUDA device `index` (-1: current) is sm_90 and the library loads."""
    try:
        lib = library()
    except RuntimeError:
        return False
    ok = ctypes.c_int(0)
    status = lib.coda_device_supported(index, ctypes.byref(ok), None, None)
    return status == 0 and ok.value == 1
