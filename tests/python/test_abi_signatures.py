"""coda/_C.py's ctypes declarations against the C headers (include/coda/*.h): ctypes trusts its argtypes blindly,
so a parameter added, removed or retyped in coda.h and not in _C.py passes garbage without an error. No GPU and no
libcoda needed: both sides are read as text and as Python objects."""
import ctypes
import re
from pathlib import Path

from coda import _C

HEADERS = sorted((Path(__file__).resolve().parents[2] / "include" / "coda").glob("*.h"))

# C type (const and spaces normalised) -> the ctypes type _C.py must declare for it.
C_TO_CTYPES = {
    "coda_tensor*": _C._T, "constcoda_tensor*": _C._T, "constcoda_ce_options*": _C._OPT,
    "float": ctypes.c_float, "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64, "size_t": ctypes.c_size_t,
    "void*": ctypes.c_void_p, "constvoid*": ctypes.c_void_p, "int": ctypes.c_int, "coda_dtype": ctypes.c_int,
    "coda_status": ctypes.c_int, "constchar*": ctypes.c_char_p, "int*": ctypes.POINTER(ctypes.c_int),
    "constcoda_block_config*": ctypes.POINTER(_C.BlockConfig),
    "constcoda_block_weights*": ctypes.POINTER(_C.BlockWeights),
    "constcoda_block_saved*": ctypes.POINTER(_C.BlockSaved), "coda_block_saved*": ctypes.POINTER(_C.BlockSaved),
    "coda_block_grads*": ctypes.POINTER(_C.BlockGrads), "coda_ce_options": _C.CeOptions,
}

# Functions of the C ABI that the Python layer does not call, and why.
C_ONLY = {
    "coda_dtype_size": "Python has torch's element sizes",
    "coda_linear_rowscale_lse": "linear_rowscale_lse runs inside coda_linear_cross_entropy, which Python calls",
    "coda_linear_rowscale_lse_workspace_size": "see coda_linear_rowscale_lse",
    "coda_rmsnorm_rstd": "linear_residual_rmsnorm's final reduce runs inside the block and that op",
}


def declarations():
    """{name: (return type, [parameter types])} of every CODA_API function in the headers, types without names."""
    out = {}
    for h in HEADERS:
        text = re.sub(r"/\*.*?\*/", " ", h.read_text(), flags=re.S)
        text = re.sub(r"//[^\n]*", " ", text)
        for ret, name, params in re.findall(r"CODA_API\s+([\w\s\*]+?)\s*\b(coda_\w+)\s*\(([^)]*)\)\s*;", text):
            types = []
            for p in params.split(","):
                p = " ".join(p.split())
                if p in ("", "void"):
                    continue
                p = re.sub(r"\s*\b\w+$", "", p) if not p.endswith("*") else p  # drop the parameter's name
                types.append(p.replace(" ", ""))
            out[name] = ("".join(ret.split()), types)
    return out


def test_headers_parse():
    decl = declarations()
    assert len(decl) >= 40 and "coda_gemm" in decl and "coda_block_backward" in decl
    assert decl["coda_gemm"][1][:3] == ["constcoda_tensor*"] * 2 + ["coda_tensor*"]


def test_every_declared_signature_matches_the_header():
    decl = declarations()
    checked = 0
    for name, (args, ws_args) in _C._SIGNATURES.items():
        for fn, argtypes, ret in ((f"coda_{name}", args, "coda_status"),
                                  (f"coda_{name}_workspace_size", ws_args, "size_t")):
            if argtypes is None:
                continue
            assert fn in decl, f"_C._SIGNATURES declares {fn}, which no header has"
            c_ret, c_types = decl[fn]
            assert c_ret == ret, f"{fn}: returns {c_ret} in the header"
            assert len(c_types) == len(argtypes), f"{fn}: {len(c_types)} parameters in the header, " \
                                                  f"{len(argtypes)} in _C._SIGNATURES"
            for i, (c, py) in enumerate(zip(c_types, argtypes)):
                assert c in C_TO_CTYPES, f"{fn}: parameter {i} has a C type this test does not map: {c}"
                assert C_TO_CTYPES[c] == py, f"{fn}: parameter {i} is {c} in the header, {py} in _C._SIGNATURES"
                checked += 1
    assert checked > 150


def test_every_header_function_is_declared_or_c_only():
    decl = declarations()
    source = (Path(_C.__file__)).read_text()
    declared = {f"coda_{n}" for n in _C._SIGNATURES}
    declared |= {f"coda_{n}_workspace_size" for n, (_, ws) in _C._SIGNATURES.items() if ws is not None}
    declared |= set(re.findall(r"lib\.(coda_\w+)\.argtypes", source))
    missing = sorted(set(decl) - declared - set(C_ONLY))
    assert not missing, f"C ABI functions with no ctypes declaration in _C.py (or C_ONLY entry here): {missing}"
    stale = sorted(set(C_ONLY) - set(decl))
    assert not stale, f"C_ONLY names functions no header has: {stale}"
    for fn in re.findall(r"lib\.(coda_\w+)\.argtypes", source):
        ret, params = decl[fn]
        got = re.search(rf"lib\.{fn}\.argtypes = (\[[^\]]*\])", source).group(1)
        assert got.count(",") + (got != "[]") == len(params), f"{fn}: {len(params)} parameters in the header"
