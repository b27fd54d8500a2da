"""What the Python benchmarks share: the model shapes, HF's RMSNorm and rotate-half as the PyTorch baselines write
them, the CUDA-event timer, and the import of the checkout's `coda` package."""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

CONFIGS = {  # d, F, hq, hkv, hd
    "llama3-1b": (2048, 8192, 32, 8, 64),
    "llama3-8b": (4096, 14336, 32, 8, 128),
    "llama3-70b": (8192, 28672, 64, 8, 128),
    "tiny": (64, 128, 2, 1, 64),  # CPU smoke runs
}
EPS = 1e-5


def hf_rms_norm(x, w):
    """transformers' LlamaRMSNorm: fp32 statistics, the normalised input rounded to x's dtype, then * w."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    return w * h.to(x.dtype)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def timed(fn, reps, warmup=3, device="cuda"):
    """Median milliseconds of fn() over reps calls after warmup calls: CUDA events on the GPU (each call synchronised
    at its end), wall clock on the CPU."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            ts.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(ts)
