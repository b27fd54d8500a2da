"""CODA's plain GEMM (coda_gemm: the autotuned CUTLASS mainloop every fused op is built on) against torch.matmul
(PyTorch's cuBLAS call, as a user's model runs it) at the block's GEMM shapes, forward, dgrad and wgrad.

    python bench/python/bench_gemm.py --configs llama3-1b,llama3-8b --tokens 8192,16384 --out gemm.jsonl

Columns: torch.matmul (PyTorch's cuBLAS call with PyTorch's handle setup); coda_gemm (its autotuned pick among the
CUTLASS configs and cuBLAS); coda_gemm pinned to its cuBLAS path (CODA_GEMM_CONFIG=cublas: the baseline's call as
libcoda makes it). Timing: --rounds rounds; in each, every implementation runs --reps back-to-back calls between
two CUDA events (the CPU runs ahead, as in a training step: GPU time), the implementations in rotating order.
Median over rounds. (Measured one implementation after the other instead, libcoda's cuBLAS call took 1.105x
torch.matmul's time on average and up to 1.28x on one shape: bench/results/gemm_torch_h200_ba4949a.md.) No L2
flush: weights stay hot as in a training step. --kernels records the kernel each ran (torch.profiler).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics

import torch
from common import CONFIGS, append_jsonl, interleaved, kernel_times, timed_pipelined
from common import short_kernel_name as cutlass_name

from coda import _C


def shapes(cfg, M):
    """(name, M, N, K, a_transposed, b_transposed) of each GEMM in one layer: D[M,N] = A[M,K] B[N,K]^T."""
    d, Fi, hq, hkv, hd = cfg
    nqkv, no = (hq + 2 * hkv) * hd, hq * hd
    out = []
    for name, n, k in (("qkv", nqkv, d), ("out", d, no), ("gate_up", 2 * Fi, d), ("down", d, Fi)):
        out.append((name, M, n, k, False, False))          # forward: x [M,k] w [n,k]^T
        out.append((name + "_dgrad", M, k, n, False, True))  # dx = dy [M,n] w [n,k]: B = w^T (column-major)
        out.append((name + "_wgrad", n, k, M, True, True))  # dW = dy^T [n,M] x [M,k]
    return out


def operands(M, N, K, at, bt, dev):
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(*((K, M) if at else (M, K)), device=dev, generator=g).bfloat16()
    b = torch.randn(*((K, N) if bt else (N, K)), device=dev, generator=g).bfloat16()
    return (a.T if at else a), (b.T if bt else b)  # a [M,K], b [N,K] as views (strided where transposed)


def coda_gemm_call(A, B, D, dev, stream, accumulate=False):
    """coda_gemm D = A B^T (accumulate: D += A B^T) as a call without arguments (descriptors and workspace made once;
    the call holds the workspace, so it lives as long as the call)."""
    ws = _C.workspace(_C.workspace_size("gemm", D.shape[0], D.shape[1], A.shape[1]), dev)
    args = (_C.desc(A), _C.desc(B), _C.desc(D), 1.0, int(accumulate), ctypes.c_void_p(ws.data_ptr()), ws.numel(),
            stream)

    def call(ws=ws):
        _C.call("gemm", *args)
    return call


def measure(m, n, k, at, bt, dev, stream, a):
    """The three implementations on one shape, interleaved; the kernel names each ran with --kernels."""
    A, B = operands(m, n, k, at, bt, dev)
    D = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    coda_fn = coda_gemm_call(A, B, D, dev, stream)

    def torch_fn():
        torch.mm(A, B.T, out=D)

    def coda_cublas_fn():
        os.environ["CODA_GEMM_CONFIG"] = "cublas"
        try:
            coda_fn()
        finally:
            del os.environ["CODA_GEMM_CONFIG"]

    fns = {"torch": torch_fn, "coda": coda_fn, "coda_cublas": coda_cublas_fn}
    for f in fns.values():  # warm up (coda_gemm autotunes on its first call), then take turns
        for _ in range(3):
            f()
    times = interleaved({k: (lambda f=f: {"ms": timed_pipelined(f, a.reps, warmup=0)}) for k, f in fns.items()},
                        a.rounds)
    failed = {k: v["error"] for k, v in times.items() if "error" in v}
    if failed:
        raise RuntimeError("; ".join(f"{k}: {e}" for k, e in failed.items()))
    t_torch, t_coda, t_cublas = (times[k]["ms"] for k in fns)
    coda_fn()
    ref = A.float() @ B.float().T
    err = ((D.float() - ref).abs().max() / ref.abs().max()).item()
    del ref
    tf = 2.0 * m * n * k / 1e9
    row = dict(torch_ms=t_torch, coda_ms=t_coda, coda_cublas_ms=t_cublas, coda_over_torch=t_coda / t_torch,
               coda_cublas_over_torch=t_cublas / t_torch, torch_tflops=tf / t_torch, coda_tflops=tf / t_coda,
               coda_rel_err=err)
    if a.kernels:
        row["torch_kernels"] = sorted(kernel_times(torch_fn))
        row["coda_kernels"] = [cutlass_name(x) for x in sorted(kernel_times(coda_fn))]
        row["coda_cublas_kernels"] = sorted(kernel_times(coda_cublas_fn))
    return row


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--configs", default="llama3-1b,llama3-8b")
    p.add_argument("--tokens", default="8192,16384")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--kernels", action="store_true")
    p.add_argument("--out", default=None)
    p.add_argument("--commit", default="unknown")
    a = p.parse_args()
    dev = torch.device("cuda")
    stream = _C.stream(dev)
    rows = []
    for cname in a.configs.split(","):
        for M in map(int, a.tokens.split(",")):
            for name, m, n, k, at, bt in shapes(CONFIGS[cname], M):
                row = dict(config=cname, tokens=M, gemm=name, M=m, N=n, K=k, commit=a.commit)
                try:
                    row.update(measure(m, n, k, at, bt, dev, stream, a))
                except Exception as e:  # reported, never hidden: the row says what failed
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                    os.environ.pop("CODA_GEMM_CONFIG", None)
                torch.cuda.empty_cache()
                rows.append(row)
                print(json.dumps(row), flush=True)
                append_jsonl(a.out, [row])  # as measured: a later failure keeps what came before
    failed = [r for r in rows if "error" in r]
    rows = [r for r in rows if "error" not in r]
    for r in failed:
        print(f"failed: {r['config']} {r['tokens']} {r['gemm']}: {r['error']}")
    print("| config | tokens | gemm | M | N | K | torch ms | coda_gemm ms | its cuBLAS ms | coda / torch "
          "| its cuBLAS / torch | torch TFLOP/s | coda TFLOP/s |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['config']} | {r['tokens']} | {r['gemm']} | {r['M']} | {r['N']} | {r['K']} | {r['torch_ms']:.3f} "
              f"| {r['coda_ms']:.3f} | {r['coda_cublas_ms']:.3f} | {r['coda_over_torch']:.3f} "
              f"| {r['coda_cublas_over_torch']:.3f} | {r['torch_tflops']:.0f} | {r['coda_tflops']:.0f} |")
    for key, what in (("coda_over_torch", "coda_gemm / torch.matmul"),
                      ("coda_cublas_over_torch", "coda_gemm's cuBLAS path / torch.matmul")):
        ratios = [r[key] for r in rows]
        if ratios:
            print(f"{what}, geometric mean over {len(ratios)} GEMMs: {statistics.geometric_mean(ratios):.3f}")


if __name__ == "__main__":
    main()
