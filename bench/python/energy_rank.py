"""Does a GEMM kernel's energy per call on a cool GPU predict its time under sustained load?

At the H200's 700 W limit a kernel's sustained time is its energy divided by the power cap, while the autotuner
times candidates on the first call, at the cool clock (1980 MHz), and picked kernels that lose under sustained load
(bench/results/vs_quack/deep_store_ab/). For each shape and pinned plain-GEMM candidate (CODA_GEMM_CONFIG) this
measures, in one run:
  cool:    after `--idle-s` of idling, `--burst-ms` of back-to-back calls: ms per call, mJ per call (NVML's total
           energy counter around the burst), SM clock;
  settled: after `--warm-s` of back-to-back calls, `--timing-ms` of them: ms per call, watts, SM clock.
Candidates are visited in rotating order per round; medians over `--rounds`. Prints a table and writes JSON lines.

    CODA_LIBRARY=build/src/libcoda.so python bench/python/energy_rank.py --out /tmp/energy
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from common import NvmlSampler, env_var  # noqa: E402

SHAPES = {  # name -> (M, N, K): llama3 gate/up (2F x d) and down (d x F) at 8192 tokens
    "gate_up_1B": (8192, 16384, 2048),
    "down_1B": (8192, 2048, 8192),
    "gate_up_8B": (8192, 28672, 4096),
}
CANDIDATES = ["cublas", "pp_128x128x64_c2x1", "pp_128x192x64_c2x1", "pp_128x192x64_c2x1_d6:raster=m,swizzle=8",
              "coop_128x256x64_c2x1", "coop_128x256x64_c2x1:raster=n,swizzle=8"]


def nvml_handle():
    import pynvml
    pynvml.nvmlInit()
    return pynvml, pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())


def burst(fn, ms, nvml=None):
    """Back-to-back calls for about `ms`: (ms per call, mJ per call or None)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    per = max(time.perf_counter() - t0, 1e-5) * 1e3
    reps = max(3, int(ms / per))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0 = nvml[0].nvmlDeviceGetTotalEnergyConsumption(nvml[1]) if nvml else None
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    e1 = nvml[0].nvmlDeviceGetTotalEnergyConsumption(nvml[1]) if nvml else None
    return start.elapsed_time(end) / reps, ((e1 - e0) / reps if nvml else None)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--candidates", default=";".join(CANDIDATES), help="';'-separated CODA_GEMM_CONFIG values")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--idle-s", type=float, default=0.7)
    p.add_argument("--burst-ms", type=float, default=120.0)
    p.add_argument("--warm-s", type=float, default=1.5)
    p.add_argument("--timing-ms", type=float, default=150.0)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    from bench_gemm import coda_gemm_call
    from coda import _C
    dev = torch.device("cuda")
    nvml = nvml_handle()
    cands = [c for c in a.candidates.split(";") if c]
    rows = []
    for shape in a.shapes.split(","):
        M, N, K = SHAPES[shape]
        g = torch.Generator(device=dev).manual_seed(0)
        A = torch.randn(M, K, device=dev, dtype=torch.bfloat16, generator=g)
        B = torch.randn(N, K, device=dev, dtype=torch.bfloat16, generator=g) * K ** -0.5
        D = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
        call = coda_gemm_call(A, B, D, dev, _C.stream(dev))
        got = {c: dict(cool_ms=[], cool_mj=[], cool_mhz=[], ms=[], watts=[], mhz=[]) for c in cands}
        for r in range(a.rounds):
            order = cands[r % len(cands):] + cands[:r % len(cands)]
            for c in order:
                with env_var("CODA_GEMM_CONFIG", c):
                    time.sleep(a.idle_s)
                    with NvmlSampler() as s:
                        ms, mj = burst(call, a.burst_ms, nvml)
                    got[c]["cool_ms"].append(ms)
                    got[c]["cool_mj"].append(mj)
                    got[c]["cool_mhz"].append(s.summary().get("clock_mhz"))
                    t_end = time.perf_counter() + a.warm_s
                    while time.perf_counter() < t_end:
                        burst(call, 50.0)
                    with NvmlSampler() as s:
                        ms, _ = burst(call, a.timing_ms)
                    got[c]["ms"].append(ms)
                    got[c]["watts"].append(s.summary().get("watts"))
                    got[c]["mhz"].append(s.summary().get("clock_mhz"))
        for c in cands:
            med = {k: statistics.median([x for x in v if x is not None]) if any(x is not None for x in v) else None
                   for k, v in got[c].items()}
            rows.append(dict(shape=shape, M=M, N=N, K=K, candidate=c, **med))
        del A, B, D, call
        torch.cuda.empty_cache()
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        with open(a.out / "energy_rank.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print("| shape | candidate | cool ms | cool mJ | cool MHz | settled ms | settled W | settled MHz | mJ/700W ms |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        f = lambda v, d=3: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
        pred = None if r["cool_mj"] is None else r["cool_mj"] / 700.0
        print(f"| {r['shape']} | {r['candidate']} | {f(r['cool_ms'])} | {f(r['cool_mj'], 1)} | {f(r['cool_mhz'], 0)} "
              f"| {f(r['ms'])} | {f(r['watts'], 0)} | {f(r['mhz'], 0)} | {f(pred)} |")


if __name__ == "__main__":
    main()
