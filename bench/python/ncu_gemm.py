"""Nsight Compute target: CODA's plain GEMM and torch.matmul on the same shapes, one launch each inside the NVTX
range "measure" (autotuning and warm-up run before it), so ncu profiles exactly the two kernels to compare.

    ncu --clock-control none --nvtx --nvtx-include "measure/" --set full python bench/python/ncu_gemm.py \
        --shapes 8192x4096x14336,8192x4096x6144t
A shape is MxNxK (D[M,N] = A[M,K] B[N,K]^T, both K-major); a trailing "t" makes B N-major (a dgrad's w).
"""
from __future__ import annotations

import argparse

import torch
from bench_gemm import coda_gemm_call, operands

from coda import _C


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="8192x4096x14336,8192x4096x6144t")
    a = p.parse_args()
    dev = torch.device("cuda")
    stream = _C.stream(dev)
    calls = []
    for s in a.shapes.split(","):
        M, N, K = map(int, s.rstrip("t").split("x"))
        A, B = operands(M, N, K, False, s.endswith("t"), dev)
        D = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
        calls.append((s, lambda A=A, B=B, D=D: torch.mm(A, B.T, out=D), coda_gemm_call(A, B, D, dev, stream)))
    for _, t, c in calls:  # autotune + warm up
        for _ in range(3):
            t()
            c()
    torch.cuda.synchronize()
    for s, t, c in calls:
        torch.cuda.nvtx.range_push("measure")
        t()
        c()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        print("profiled", s, flush=True)


if __name__ == "__main__":
    main()
