"""CODA under CUDA graph capture (torch.cuda.graph): graph_capture.py, in a child process, captures a block's
forward and backward on a stream libcoda has not seen, then checks that replays are deterministic and equal eager
execution on the same inputs (within one GEMM's rounding: a cuBLAS pick runs a CODA kernel in the capture)."""
import subprocess
import sys
from pathlib import Path

from conftest import requires_gpu


@requires_gpu
def test_gpu_block_forward_backward_replays_a_captured_graph():
    script = Path(__file__).resolve().parent / "graph_capture.py"
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    print(r.stdout[-2000:], r.stderr[-4000:])
    assert r.returncode == 0, f"graph_capture.py exited {r.returncode}: {(r.stderr or r.stdout).strip()[-1500:]}"
    assert r.stdout.strip().splitlines()[-1].startswith("ok:"), r.stdout[-500:]
