"""Every script in tools/ answers --help with its usage and exit status 0, without building or downloading."""
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
    """tools/kernel-stages reads the build's objects: every fused-op and plain-GEMM source gets a line, and no kernel
    is left fewer than 3 mainloop stages by its epilogue's shared memory (a cooperative B2 with 2 ran 4-8 % slower
    in the block: bench/results/block_variants_h200/README.md, stop 19). Needs the objects of a build (tools/test
    builds first; a Python-only run without build/ skips, saying so)."""
    import os
    root = TOOLS.parent
    build = Path(os.environ.get("CODA_BUILD_DIR", root / "build"))
    if not (build / "src" / "CMakeFiles" / "coda.dir").is_dir():
        pytest.skip(f"no build objects under {build} (tools/test builds them)")
    r = subprocess.run([str(TOOLS / "kernel-stages")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()[1:]]
    listed = {row[-1] for row in rows}
    sources = {str(p.relative_to(root / "src")) for d in ("ops", "gemm/instances")
               for p in (root / "src" / d).rglob("*.cu") if "_pp_" in p.name or "_coop_" in p.name or "_sk_" in p.name}
    assert sources and sources <= listed, sorted(sources - listed)
    few = [(row[0], row[-1]) for row in rows if int(row[0]) < 3]
    assert not few, few


def test_kernel_stages_without_a_build_says_so(tmp_path):
    r = subprocess.run([str(TOOLS / "kernel-stages")], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "CODA_BUILD_DIR": str(tmp_path)})
    assert r.returncode == 1 and "no objects under" in r.stderr, r.stderr
