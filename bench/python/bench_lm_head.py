"""LM head + cross-entropy benchmark (issue 7): final RMSNorm + LM head + loss, forward+backward, at llama3-1B
(d = 2048, V = 128256): CODA's linear_cross_entropy vs PyTorch eager (materialised logits), torch.compile of it,
and Liger's fused linear cross-entropy (with Liger's RMSNorm before it). Time (median of --reps, CUDA events) and
peak memory above the inputs (torch.cuda.max_memory_allocated) of one forward+backward.

    python bench/python/bench_lm_head.py --tokens 8192 --out bench/results/lm_head_torch.jsonl
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from common import EPS, hf_rms_norm, profile, timed

import coda


def torch_head(x, g, w, t):
    logits = hf_rms_norm(x, g) @ w.T
    return F.cross_entropy(logits.float(), t)


def impls():
    out = {"coda": lambda x, g, w, t: coda.ops.linear_cross_entropy(x, g, w, t, EPS),
           "eager": torch_head,
           "compile": torch.compile(torch_head, fullgraph=True)}
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        def liger(x, g, w, t):
            n = LigerRMSNormFunction.apply(x, g, EPS)
            return LigerFusedLinearCrossEntropyFunction.apply(n, w, t)[0]
        out["liger"] = liger
    except ImportError as e:
        print(f"liger not available: {e}")
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--out", type=Path)
    p.add_argument("--commit", default="unknown")
    p.add_argument("--profile", action="store_true", help="also print where each implementation's time goes on the GPU timeline")
    a = p.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    M, d, V = a.tokens, a.hidden, a.vocab
    x = (torch.randn(M, d, device="cuda", generator=gen) * 3).bfloat16().requires_grad_()
    g = (1 + 0.1 * torch.randn(d, device="cuda", generator=gen)).bfloat16().requires_grad_()
    w = (0.02 * torch.randn(V, d, device="cuda", generator=gen)).bfloat16().requires_grad_()
    t = torch.randint(0, V, (M,), device="cuda", generator=gen)
    rows, losses = [], {}
    for name, fn in impls().items():
        def step():
            loss = fn(x, g, w, t)
            loss.backward()
            x.grad = g.grad = w.grad = None
            return loss
        try:
            losses[name] = step().item()
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            step()
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - base) / 2**30
            with torch.no_grad():
                t_f = timed(lambda: fn(x, g, w, t), a.reps)
            t_fb = timed(step, a.reps)
            r = dict(impl=name, forward_ms=t_f, fwd_bwd_ms=t_fb, peak_extra_gib=peak, loss=losses[name])
            if a.profile:
                with torch.no_grad():
                    profile(f"{name} forward (no grad)", lambda: fn(x, g, w, t))
                profile(f"{name} forward+backward", step)
        except Exception as e:
            r = dict(impl=name, error=f"{type(e).__name__}: {e}"[:300])
        r.update(tokens=M, hidden=d, vocab=V, commit=a.commit, gpu=torch.cuda.get_device_name())
        rows.append(r)
        print(json.dumps(r), flush=True)
    base = next(r for r in rows if r["impl"] == "coda")
    if a.out:
        with open(a.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print("| impl | fwd ms | f+b ms | f+b time / CODA's | peak extra GiB | loss |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['impl']} | error: {r['error'][:80]} |")
        else:
            print(f"| {r['impl']} | {r['forward_ms']:.2f} | {r['fwd_bwd_ms']:.2f} | "
                  f"{r['fwd_bwd_ms'] / base['fwd_bwd_ms']:.3f} | {r['peak_extra_gib']:.2f} | {r['loss']:.5f} |")


if __name__ == "__main__":
    main()
