"""Fused-op config and knob choice under sustained load (docs/FUSED_OPS.md, "Dispatch and config selection").

    python bench/python/sweep_ops.py --ops f3,f5 --configs llama3-70b:8192,llama3-8b:16384 [--pins 'PIN;PIN']

For each (op, model config, tokens), the op's candidates (`CODA_OP_CONFIG` pins, `config[:knobs]`, read by libcoda
on every call; `default` = no pin, the dispatcher's own choice) and the cuBLAS GEMM of the op's shape
(torch.matmul, bf16) take turns over --rounds rounds (common.interleaved: the order rotates by one per round), each
timed as --reps back-to-back calls (common.timed_pipelined) so the card stays loaded as in a training step. After
each timing the SM clock (MHz) and board power (W) are read (torch.cuda.clock_rate / power_draw): at the 700 W
limit a kernel can lose time to clock rather than instructions, and bench_fused --sweep, which times its points
one after another, drifted 2-5 % against its own main measurement (bench/results/fused_sweep_h200_d6e113e/).

Ops (their GEMM shapes as in bench_fused): f1_out (o-projection + residual + RMSNorm partials), f1_down
(down-projection, the same epilogue), f3 (gate/up + SwiGLU, interleaved weight), f4 (q/k/v + RoPE), f5 (LM head +
log-sum-exp through coda_linear_cross_entropy with one chunk: F5 without stored logits plus its small finishing
kernels; V = 128256). Default pins: `default` and every compiled bf16 config x raster n/m x swizzle 1/2/4/8.

Prints, per (op, config, tokens), the candidates sorted by median time: ms, time / cuBLAS, median clock and power;
--out appends one JSON line per candidate.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from common import CONFIGS, append_jsonl, interleaved, timed_pipelined

from coda import _kernels

FUSED_CONFIGS = ("coop_128x256x64_c2x1", "pp_128x128x64_c2x1")
VOCAB = 128256


def default_pins():
    pins = ["default"]
    for c in FUSED_CONFIGS:
        pins += [f"{c}:raster={r},swizzle={s}" for r in "nm" for s in (1, 2, 4, 8)]
    return pins


def make_op(op, cfg, M, device="cuda"):
    """(call, (M, N, K) of its GEMM, cuBLAS call of that shape) for one op at one model config."""
    d, F, hq, hkv, hd = cfg
    g = torch.Generator(device=device).manual_seed(0)

    def rand(*shape, std=1.0):
        return (torch.randn(*shape, device=device, generator=g) * std).to(torch.bfloat16)
    rstd = torch.rand(M, device=device, generator=g) + 0.5
    if op in ("f1_out", "f1_down"):
        K = hq * hd if op == "f1_out" else F
        a, w, residual = rand(M, K), rand(d, K, std=K ** -0.5), rand(M, d, std=4.0)
        gamma = 1 + rand(d, std=0.1)
        return (lambda: _kernels.linear_residual_rmsnorm(a, w, residual, gamma, 1e-6)), (M, d, K), \
            (lambda: torch.matmul(a, w.t()))
    h = rand(M, d, std=4.0)
    if op == "f3":
        w = rand(2 * F, d, std=d ** -0.5)
        return (lambda: _kernels.linear_rowscale_swiglu(h, w, rstd)), (M, 2 * F, d), (lambda: torch.matmul(h, w.t()))
    if op == "f4":
        N = (hq + 2 * hkv) * hd
        w = rand(N, d, std=d ** -0.5)
        pos = (torch.arange(M, device=device) % 8192).to(torch.int32)
        inv = 1.0 / 500000.0 ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd)
        return (lambda: _kernels.linear_rowscale_rope(h, w, rstd, pos, inv, hq, hkv, hd)), (M, N, d), \
            (lambda: torch.matmul(h, w.t()))
    if op == "f5":
        w = rand(VOCAB, d, std=d ** -0.5)
        targets = torch.randint(0, VOCAB, (M,), device=device, generator=g)
        return (lambda: _kernels.linear_cross_entropy(h, w, rstd, targets, -100, "mean", 0.0, 0.0, 0.0, M)), \
            (M, VOCAB, d), (lambda: torch.matmul(h, w.t()))
    raise ValueError(f"--ops: unknown op {op!r} (f1_out, f1_down, f3, f4, f5)")


def pinned(pin, fn):
    """fn with CODA_OP_CONFIG set to pin for the call (unset for `default`), restored after."""
    def call():
        old = os.environ.get("CODA_OP_CONFIG")
        if pin == "default":
            os.environ.pop("CODA_OP_CONFIG", None)
        else:
            os.environ["CODA_OP_CONFIG"] = pin
        try:
            return fn()
        finally:
            if old is None:
                os.environ.pop("CODA_OP_CONFIG", None)
            else:
                os.environ["CODA_OP_CONFIG"] = old
    return call


def measure(fn, reps):
    def run():
        ms = timed_pipelined(fn, reps)
        return {"ms": ms, "clock_mhz": float(torch.cuda.clock_rate()), "power_w": torch.cuda.power_draw() / 1000.0}
    return run


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ops", default="f3,f5")
    p.add_argument("--configs", default="llama3-70b:8192")
    p.add_argument("--pins", default=None,
                   help="';'-separated CODA_OP_CONFIG values (knobs contain commas), e.g. "
                        "'default;coop_128x256x64_c2x1:raster=n,swizzle=2' (default: see the docstring)")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--commit", default="unknown")
    args = p.parse_args()
    pins = [x for x in args.pins.split(";") if x] if args.pins else default_pins()
    for spec in args.configs.split(","):
        name, tokens = spec.split(":")
        for op in args.ops.split(","):
            fn, (M, N, K), cublas = make_op(op, CONFIGS[name], int(tokens))
            cands = {"cublas": measure(cublas, args.reps)}
            for pin in pins:
                cands[pin] = measure(pinned(pin, fn), args.reps)
            got = interleaved(cands, args.rounds)
            base = got["cublas"].get("ms")
            print(f"\n{op} {name} M={M} N={N} K={K}: {args.rounds} rounds x {args.reps} back-to-back calls")
            print("| candidate | ms | time / cuBLAS | MHz | W |")
            print("|---|---:|---:|---:|---:|")
            rows = []
            for cand, r in sorted(got.items(), key=lambda kv: kv[1].get("ms", float("inf"))):
                if "error" in r:
                    print(f"| {cand} | error: {r['error']} | | | |")
                    continue
                ratio = r["ms"] / base if base else None  # None when the cuBLAS candidate failed
                shown = "n/a" if ratio is None else f"{ratio:.3f}"
                print(f"| {cand} | {r['ms']:.4f} | {shown} | {r['clock_mhz']:.0f} | {r['power_w']:.0f} |")
                rows.append(dict(op=op, config=name, M=M, N=N, K=K, candidate=cand, time_vs_cublas=ratio,
                                 commit=args.commit, **r))
            append_jsonl(args.out, rows)


if __name__ == "__main__":
    main()
