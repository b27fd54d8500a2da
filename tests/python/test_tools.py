"""Every script in tools/ answers --help with its usage and exit status 0, without building or downloading."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"


@pytest.mark.parametrize("tool", sorted(p.name for p in TOOLS.iterdir() if p.is_file()))
def test_tool_help(tool):
    r = subprocess.run([str(TOOLS / tool), "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip().splitlines()) >= 2, r.stdout


def test_kernel_stages_lists_every_compiled_kernel_with_at_least_three_stages():
    """tools/kernel-stages reads the build's objects: every fused-op and plain-GEMM instance gets a line, and no kernel
    is left fewer than 3 mainloop stages by its epilogue's shared memory (a cooperative linear_residual_rmsnorm_bwd
    with 2 ran 4-8 % slower in the block: bench/results/block_variants_h200/README.md, stop 19). Needs the objects of
    a build (tools/test builds first; a Python-only run without build/ skips, saying so)."""
    root = TOOLS.parent
    build = Path(os.environ.get("CODA_BUILD_DIR", root / "build"))
    if not (build / "src" / "CMakeFiles" / "coda.dir").is_dir():
        pytest.skip(f"no build objects under {build} (tools/test builds them)")
    r = subprocess.run([str(TOOLS / "kernel-stages")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()[1:]]
    listed = {row[-1] for row in rows}
    generated = (build / "src" / "generated" / "kernel_sources.txt").read_text().split()
    instances = {"generated/" + p.split("/src/generated/", 1)[1] for p in generated}
    # One generated instance per (kernel, dtype, config) of src/ops/*/op.cmake and src/gemm/plain.cmake: 30 fused and
    # 18 plain today.
    fused = {p for p in instances if p.startswith("generated/ops/")}
    plain = {p for p in instances if p.startswith("generated/gemm/")}
    assert len(fused) >= 30 and len(plain) >= 18 and fused | plain == instances, sorted(instances)
    assert instances <= listed, sorted(instances - listed)
    few = [(row[0], row[-1]) for row in rows if int(row[0]) < 3]
    assert not few, few


def test_kernel_stages_without_a_build_says_so(tmp_path):
    r = subprocess.run([str(TOOLS / "kernel-stages")], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "CODA_BUILD_DIR": str(tmp_path)})
    assert r.returncode == 1 and "no objects under" in r.stderr, r.stderr


def _no_gpu_env(tmp_path):
    """The environment of a machine without a CUDA GPU (CUDA_VISIBLE_DEVICES hides any there is), with the build
    folder in tmp_path, so that nothing may be built into the checkout."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", CODA_BUILD_DIR=str(tmp_path / "build"))
    env.pop("PYTHONPATH", None)
    return env


def test_train_without_a_gpu_says_what_to_try_and_builds_nothing(tmp_path):
    """Issue 24, item 9: tools/train on a machine without an sm_90 GPU stops at once, builds nothing, and names what
    runs there instead (tools/test, the CPU example); the example it prints runs as written."""
    r = subprocess.run([str(TOOLS / "train")], capture_output=True, text=True, timeout=300, env=_no_gpu_env(tmp_path))
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "needs an NVIDIA Hopper GPU" in r.stderr and "no CUDA GPU" in r.stderr, r.stderr
    assert "tools/test" in r.stderr and "README.md" in r.stderr, r.stderr
    assert not (tmp_path / "build").exists(), "tools/train built without a GPU"
    example = [line.strip() for line in r.stderr.splitlines() if line.strip().startswith("PYTHONPATH=")]
    assert len(example) == 1, r.stderr
    e = subprocess.run(["bash", "-c", example[0]], capture_output=True, text=True, timeout=300,
                       env=_no_gpu_env(tmp_path), cwd=tmp_path)
    assert e.returncode == 0, e.stderr
    assert float(e.stdout.strip().removeprefix("tensor(").removesuffix(")")) < 1e-4, e.stdout


def test_train_help_says_what_the_wrapper_does_before_the_module_options(tmp_path):
    """Issue 24, item 10: tools/train --help describes the wrapper (GPU check, dependencies, libcoda build,
    CODA_BUILD_DIR), then prints python -m coda.train's own help."""
    r = subprocess.run([str(TOOLS / "train"), "--help"], capture_output=True, text=True, timeout=300,
                       env=_no_gpu_env(tmp_path))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("usage: tools/train"), out
    for words in ("CODA_BUILD_DIR", "Builds libcoda", "Installs the Python dependencies", "sm_90"):
        assert words in out, words
    module = out.find("usage: python -m coda.train")
    assert module > out.find("CODA_BUILD_DIR") > 0, out
    assert not (tmp_path / "build").exists()


# A ctest run as a machine without a GPU sees it: GPU tests skipped (GoogleTest's "file:line: Skipped", then the
# reason), one with another reason, a passing and a failing CPU test. The CTestTestfile.cmake is what CMake writes
# for add_test/set_tests_properties, so ctest runs it without a configure step (the backslashes at line ends are
# Python's: the file has one line per command).
_CTEST_FILE = """
foreach(i 1 2 3 4)
  add_test(Gpu.T${i} sh -c "echo '[ RUN      ] Gpu.T${i}'; echo 'gpu_util.hpp:27: Skipped'; \
echo 'no CUDA device: none'; echo; echo '[  SKIPPED ] Gpu.T${i} (0 ms)'")
  set_tests_properties(Gpu.T${i} PROPERTIES LABELS gpu SKIP_REGULAR_EXPRESSION "\\\\[  SKIPPED \\\\]")
endforeach()
add_test(Gpu.Other sh -c "echo 'x.cpp:613: Skipped'; echo 'validation rejects V = 1'; \
echo '[  SKIPPED ] Gpu.Other (0 ms)'")
set_tests_properties(Gpu.Other PROPERTIES LABELS gpu SKIP_REGULAR_EXPRESSION "\\\\[  SKIPPED \\\\]")
add_test(Cpu.Pass sh -c "echo ok")
add_test(Cpu.Fail sh -c "echo 'expected 1, got 2'; exit 1")
"""


def test_test_summary_prints_each_ctest_skip_reason_once_with_a_count(tmp_path):
    """Issue 24, item 11: tools/test's ctest output lists no skipped test by name (ctest prints each twice), says
    once per reason how many skipped, and keeps a failure's output and ctest's list of failures."""
    if shutil.which("ctest") is None:
        pytest.skip("no ctest here")
    (tmp_path / "CTestTestfile.cmake").write_text(_CTEST_FILE)
    raw = subprocess.run(["ctest", "--output-on-failure"], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert raw.stdout.count("Gpu.T1") == 3, raw.stdout  # "Start", "***Skipped" and "did not run" lines
    r = subprocess.run(f"ctest --output-on-failure 2>&1 | {TOOLS / 'test-summary'} ctest", shell=True,
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "Gpu.T" not in out and "Skipped" not in out and "did not run" not in out, out
    assert "== 4 C++ tests skipped: no CUDA device: none" in out, out
    assert "== 1 C++ test skipped: validation rejects V = 1" in out, out
    assert "Cpu.Pass" in out and "Passed" in out, out
    assert "expected 1, got 2" in out and "The following tests FAILED:" in out and "Cpu.Fail (Failed)" in out, out


def test_test_summary_prints_each_pytest_skip_reason_once_with_a_count(tmp_path):
    """Issue 24, item 11: pytest -rs prints one SKIPPED line per test function; tools/test runs pytest without it
    and tools/test-summary prints, from the JUnit report, one line per reason with the count (xfails are not
    skips)."""
    body = ("import pytest\n"
            "gpu = pytest.mark.skipif(True, reason='GPU test: no CUDA device')\n"
            "@gpu\n@pytest.mark.parametrize('i', range(3))\ndef test_g(i): pass\n"
            "@gpu\ndef test_h(): pass\n"
            "def test_ok(): pass\n"
            "def test_bad(): assert 1 == 2\n"
            "def test_own(): pytest.skip('needs transformers')\n"
            "@pytest.mark.xfail(reason='known')\ndef test_xf(): assert 0\n")
    for name in ("test_a.py", "test_b.py"):
        (tmp_path / name).write_text(body)
    run = subprocess.run(["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", ".",
                          "--junitxml=pytest.xml", "."], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 1 and "2 failed, 2 passed, 10 skipped, 2 xfailed" in run.stdout, run.stdout
    r = subprocess.run([str(TOOLS / "test-summary"), "pytest"], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["== 8 Python tests skipped: GPU test: no CUDA device",
                                     "== 2 Python tests skipped: needs transformers"], r.stdout


def _without_module(tmp_path, name):
    """The no-GPU environment where `import name` fails (a package that raises ImportError first on PYTHONPATH) and
    pip may not reach an index (an attempt to install fails)."""
    fake = tmp_path / "site" / name
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f"raise ImportError('no {name} here (test)')\n")
    return dict(_no_gpu_env(tmp_path), PYTHONPATH=str(tmp_path / "site"), PIP_NO_INDEX="1")


def test_train_with_torch_but_no_gpu_installs_nothing(tmp_path):
    """With torch importable but another dependency missing (a tqdm whose import fails), tools/train asks torch for the
    GPU before it would install anything, and stops there."""
    env = _without_module(tmp_path, "tqdm")
    r = subprocess.run([str(TOOLS / "train")], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "no CUDA GPU" in r.stderr, r.stderr
    assert "install-deps" not in r.stdout + r.stderr.split("Without such a GPU")[0], r.stdout + r.stderr
    assert not (tmp_path / "build").exists()


def test_train_without_torch_or_a_gpu_installs_nothing(tmp_path):
    """Issue 24, item 9: without torch and without nvidia-smi, tools/train says there is no GPU before installing
    the Python dependencies (an import of torch that fails stands for a machine without it; pip may not reach an
    index, so an attempt to install would fail the test)."""
    if shutil.which("nvidia-smi"):
        pytest.skip("nvidia-smi is here: tools/train would install the dependencies and ask torch")
    env = _without_module(tmp_path, "torch")
    r = subprocess.run([str(TOOLS / "train")], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "no NVIDIA GPU" in r.stderr and "tools/test" in r.stderr, r.stderr
    assert "install-deps: pip install" not in r.stdout + r.stderr, r.stdout
    assert not (tmp_path / "build").exists()
