"""Nsight Compute target: CODA's plain GEMM and torch.matmul on the same shapes, one launch each inside the NVTX
range "measure" (autotuning and warm-up run before it), so ncu profiles exactly the two kernels to compare.

    ncu --clock-control none --nvtx --nvtx-include "measure/" --set full python bench/python/ncu_gemm.py \
        --shapes 8192x4096x14336,8192x4096x6144t
A shape is MxNxK (D[M,N] = A[M,K] B[N,K]^T, both K-major); a trailing "t" makes B N-major (a dgrad's w).
"""
from __future__ import annotations

import argparse
import ctypes

import torch

from coda import _C


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="8192x4096x14336,8192x4096x6144t")
    a = p.parse_args()
    dev = torch.device("cuda")
    stream = _C.stream(dev)
    calls = []
    for s in a.shapes.split(","):
        bt = s.endswith("t")
        M, N, K = map(int, s.rstrip("t").split("x"))
        A = torch.randn(M, K, device=dev).bfloat16()
        B = torch.randn(K, N, device=dev).bfloat16().T if bt else torch.randn(N, K, device=dev).bfloat16()
        D = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
        ws = _C.workspace(_C.workspace_size("gemm", M, N, K), dev)
        args = (_C.desc(A), _C.desc(B), _C.desc(D), 1.0, 0, ctypes.c_void_p(ws.data_ptr()), ws.numel(), stream)
        calls.append((s, lambda A=A, B=B, D=D: torch.mm(A, B.T, out=D), lambda args=args: _C.call("gemm", *args)))
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
