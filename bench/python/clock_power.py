"""SM clock and board power next to the time of fused forward kernels and cuBLAS at the large gate/up and down
shapes (llama3-70B and 8B, M = 8192): whether a kernel loses time to the 700 W limit rather than to its own
instruction count.

    python bench/python/clock_power.py

Each implementation in turn (order rotated over 3 rounds), 10 back-to-back calls timed with CUDA events, then
torch.cuda.clock_rate() (MHz) and torch.cuda.power_draw() (W) read right after: the clock the calls ended at.
cuBLAS (torch.matmul) runs the gate/up GEMM as one [2F, d] weight and as HF's two [F, d] ones. Prints one line per
implementation: the median time and every round's time@clock/power. No JSON.
"""
from __future__ import annotations

import torch
from common import timed_pipelined

from coda import _kernels


def main():
    dev = "cuda"
    for name, d, F in (("llama3-70b", 8192, 28672), ("llama3-8b", 4096, 14336)):
        M = 8192
        g = torch.Generator(device=dev).manual_seed(0)
        rand = lambda *s, std=1.0: (torch.randn(*s, device=dev, generator=g) * std).to(torch.bfloat16)  # noqa: E731
        h, w_gu = rand(M, d), rand(2 * F, d, std=0.01)
        w_gate, w_up = w_gu[0::2].contiguous(), w_gu[1::2].contiguous()
        rstd = torch.ones(M, device=dev)
        y, w_down, residual = rand(M, F), rand(d, F, std=0.01), rand(M, d)
        gamma = torch.ones(d, device=dev, dtype=torch.bfloat16)
        fns = {
            "coda F3 (gate/up + SwiGLU)": lambda: _kernels.linear_rowscale_swiglu(h, w_gu, rstd),
            "cuBLAS gate/up, one GEMM": lambda: torch.matmul(h, w_gu.t()),
            "cuBLAS gate/up, two GEMMs": lambda: (torch.matmul(h, w_gate.t()), torch.matmul(h, w_up.t())),
            "coda F1 (down + residual + norm)": lambda: _kernels.linear_residual_rmsnorm(y, w_down, residual, gamma,
                                                                                          1e-6),
            "cuBLAS down": lambda: torch.matmul(y, w_down.t()),
        }
        runs = {k: [] for k in fns}
        keys = list(fns)
        for r in range(3):
            for k in keys[r:] + keys[:r]:
                t = timed_pipelined(fns[k], 10, warmup=1)
                runs[k].append((t, torch.cuda.clock_rate(), torch.cuda.power_draw() / 1000))
        for k, v in runs.items():
            med = sorted(x[0] for x in v)[1]
            print(f"{name} {k:34s} median {med:7.3f} ms  " + " ".join(f"{t:.3f}@{c}MHz/{p:.0f}W" for t, c, p in v))


if __name__ == "__main__":
    main()
