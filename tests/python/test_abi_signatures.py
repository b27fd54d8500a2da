"""coda/_C.py declares every C function from the header text libcoda carries (coda_abi_declarations): ctypes trusts
its argtypes blindly, so a parameter added, removed or retyped in coda.h and declared differently in Python would pass
garbage without an error. These tests hold the parser and its type map to the headers (no GPU, no library needed)
and, where libcoda loads, the library's text to the headers it was built from and the Python layer's calls to the
declarations."""
import ctypes
import re
from pathlib import Path

import pytest

from coda import _C

ROOT = Path(__file__).resolve().parents[2]
ABI_HEADERS = [ROOT / "include" / "coda" / h for h in ("coda.h", "block.h")]  # the order src/CMakeLists.txt embeds


def header_text():
    return "".join(h.read_text(encoding="utf-8") for h in ABI_HEADERS)


def test_headers_parse():
    decl = _C.declarations(header_text())
    # every CODA_API declaration parsed (one the pattern missed would go undeclared, its arguments unchecked)
    stripped = re.sub(r"//[^\n]*", " ", re.sub(r"/\*.*?\*/", " ", header_text(), flags=re.S))
    assert len(decl) == len(re.findall(r"^\s*CODA_API\b", stripped, flags=re.M)) >= 40
    assert "coda_gemm" in decl and "coda_block_backward" in decl
    assert decl["coda_gemm"][1][:3] == ["constcoda_tensor*"] * 2 + ["coda_tensor*"]
    assert decl["coda_last_error"] == ("constchar*", [])
    assert decl["coda_ce_options_default"] == ("coda_ce_options", [])
    result, params = decl["coda_linear_rowscale_qk_norm_rope"]
    assert result == "coda_status" and params[7:11] == ["int32_t", "int32_t", "int32_t", "float"]
    assert params[-3:] == ["coda_tensor*", "coda_tensor*", "void*"]


def test_every_public_header_with_functions_is_embedded():
    """src/CMakeLists.txt embeds ABI_HEADERS' text in libcoda; a public header with C functions left out of it would
    have them undeclared in Python."""
    with_functions = {h.name for h in (ROOT / "include" / "coda").glob("*.h")
                      if _C.declarations(h.read_text(encoding="utf-8"))}
    assert with_functions == {h.name for h in ABI_HEADERS}
    cmake = (ROOT / "src" / "CMakeLists.txt").read_text(encoding="utf-8")
    assert all(f"include/coda/{h.name}" in cmake for h in ABI_HEADERS)


def test_parser_drops_comments_and_parameter_names():
    text = """/* CODA_API int coda_commented(void); */
    // CODA_API int coda_line_commented(void);
    CODA_API const char* coda_a(const coda_tensor* x,   int64_t
        n, void* stream);   /** doc */ CODA_API size_t coda_b(void);"""
    assert _C.declarations(text) == {"coda_a": ("constchar*", ["constcoda_tensor*", "int64_t", "void*"]),
                                     "coda_b": ("size_t", [])}


def test_every_header_type_is_mapped():
    unmapped = [(name, t) for name, (result, params) in _C.declarations(header_text()).items()
                for t in [result] + params if t not in _C.CTYPES]
    assert not unmapped, f"C types with no ctypes mapping in _C.CTYPES: {unmapped}"


def test_an_unmapped_type_is_refused_by_name():
    with pytest.raises(RuntimeError, match=r"coda_x: parameter 2 has the C type 'coda_widget\*'"):
        _C._ctype("coda_x", "coda_widget*", "parameter 2")


def test_every_function_the_python_layer_calls_is_declared():
    decl = _C.declarations(header_text())
    source = "".join(p.read_text(encoding="utf-8") for p in (ROOT / "python" / "coda").rglob("*.py"))
    called = set(re.findall(r'_C\.call\("(\w+)"', source))
    called |= set(re.findall(r'(?:\blib|library\(\))\.coda_(\w+)\b', source))  # lib.coda_x, library().coda_x
    called |= {f"{n}_workspace_size" for n in re.findall(r'\bworkspace\("(\w+)"', source)}
    called |= {f"{n}_workspace_size" for n in re.findall(r'workspace_size\("(\w+)"', source)}
    assert len(called) > 15
    missing = sorted(f"coda_{n}" for n in called if f"coda_{n}" not in decl)
    assert not missing, f"the Python layer calls C functions no header declares: {missing}"


@pytest.mark.skipif(not _C.available(), reason="libcoda is not built")
def test_library_carries_the_headers_it_was_built_with():
    lib = _C.library()
    assert lib.coda_abi_declarations().decode() == header_text()
    fn = lib.coda_linear_rowscale_qk_norm_rope
    assert fn.restype is ctypes.c_int and len(fn.argtypes) == 14 and fn.argtypes[10] is ctypes.c_float
    assert lib.coda_ce_options_default.restype is _C.CeOptions
    with pytest.raises(TypeError):  # too few arguments: refused before the call
        lib.coda_linear_rowscale_workspace_size(1)
    with pytest.raises(ctypes.ArgumentError):  # a string for an int64_t
        lib.coda_linear_rowscale_workspace_size("1", 2)
