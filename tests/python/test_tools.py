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
