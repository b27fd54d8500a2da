"""Does CODA's q/k/v layout cost attention time? Causal SDPA (PyTorch's default backend choice, flash/cuDNN on
the H200), forward and forward+backward, on q, k, v taken three ways:

  fused     views into one [B, S, (hq + 2 hkv) hd] projection output, as coda.models.stack.attention takes them
            (the backward's split concatenates dq, dk, dv into one d(qkv));
  separate  three contiguous [B, S, h hd] projections, as HF LLaMA takes them;
  bhsd      contiguous [B, h, S, hd] tensors (the layout attention kernels read natively).

    python bench/python/bench_attention.py --configs llama3-1b,llama3-8b --batch 4 --seq 8192

Timing: CUDA events, median of --reps calls each synchronized; the kernels' own time from torch.profiler.
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from common import CONFIGS, append_jsonl, kernel_times, timed


def make(layout, B, S, hq, hkv, hd, dev):
    g = torch.Generator(device=dev).manual_seed(0)
    r = lambda *s: torch.randn(*s, device=dev, generator=g).bfloat16().requires_grad_()  # noqa: E731
    if layout == "fused":
        qkv = r(B, S, (hq + 2 * hkv) * hd)
        leaves = [qkv]

        def qkv_fn():
            q, k, v = torch.split(qkv, [hq * hd, hkv * hd, hkv * hd], dim=-1)
            return (q.view(B, S, hq, hd).transpose(1, 2), k.view(B, S, hkv, hd).transpose(1, 2),
                    v.view(B, S, hkv, hd).transpose(1, 2))
    elif layout == "separate":
        q, k, v = r(B, S, hq * hd), r(B, S, hkv * hd), r(B, S, hkv * hd)
        leaves = [q, k, v]

        def qkv_fn():
            return (q.view(B, S, hq, hd).transpose(1, 2), k.view(B, S, hkv, hd).transpose(1, 2),
                    v.view(B, S, hkv, hd).transpose(1, 2))
    else:
        q, k, v = r(B, hq, S, hd), r(B, hkv, S, hd), r(B, hkv, S, hd)
        leaves = [q, k, v]

        def qkv_fn():
            return q, k, v
    dy = torch.randn(B, S, hq * hd, device=dev, generator=g).bfloat16()

    def fwd():
        q, k, v = qkv_fn()
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hq != hkv)
        return y.transpose(1, 2).reshape(B, S, hq * hd)

    def fwd_bwd():
        torch.autograd.backward(fwd(), dy)
        for t in leaves:
            t.grad = None
    return fwd, fwd_bwd


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--configs", default="llama3-1b,llama3-8b")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--out", default=None)
    p.add_argument("--commit", default="unknown")
    a = p.parse_args()
    dev = torch.device("cuda")
    rows = []
    for cname in a.configs.split(","):
        d, Fi, hq, hkv, hd = CONFIGS[cname]
        for layout in ("fused", "separate", "bhsd"):
            fwd, fwd_bwd = make(layout, a.batch, a.seq, hq, hkv, hd, dev)
            with torch.no_grad():
                t_f = timed(fwd, a.reps)
            t_fb = timed(fwd_bwd, a.reps)
            ks = {k[:90]: v for k, v in kernel_times(fwd_bwd).items()}
            top = sorted(ks.items(), key=lambda kv: -kv[1])[:6]
            row = dict(config=cname, batch=a.batch, seq=a.seq, layout=layout, fwd_ms=t_f, fwd_bwd_ms=t_fb,
                       kernels_ms=sum(ks.values()), top_kernels=top, commit=a.commit)
            rows.append(row)
            print(json.dumps(row), flush=True)
    append_jsonl(a.out, rows)
    print("| config | B x S | layout | fwd ms | f+b ms | f+b kernels ms |")
    print("|---|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['config']} | {r['batch']} x {r['seq']} | {r['layout']} | {r['fwd_ms']:.3f} | {r['fwd_bwd_ms']:.3f} "
              f"| {r['kernels_ms']:.3f} |")


if __name__ == "__main__":
    main()
