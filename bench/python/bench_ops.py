"""Kernel-level benchmark of the Python ops (issue 7): each fused op, forward and forward+backward, against the
cuBLAS GEMMs it contains (torch.matmul, nothing else), the same computation in PyTorch eager, torch.compile of it,
and Liger Kernel's kernels where Liger has the op.

    python bench/python/bench_ops.py --configs llama3-1b,llama3-8b,llama3-70b --tokens 16384 --out ops.jsonl

Ops: qkv_rope (RMSNorm + q/k/v projection + RoPE), swiglu_mlp (RMSNorm + gate/up + SwiGLU + down + residual),
cross_entropy (stored logits, V = 128256). Timing: CUDA events, median of --reps calls per round, median over
--rounds rounds in which the implementations take turns (common.interleaved); backward gets fixed random output
gradients. `gemm_only` is the lower bound a fused op aims at: its GEMMs through cuBLAS with no other work.
--device cpu runs tiny shapes for a smoke test (no Liger).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from common import CONFIGS, EPS, append_jsonl, hf_rms_norm, interleaved, is_cuda, rotate_half, timed

import coda

def liger():
    try:
        from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
    except ImportError:
        return None
    return dict(norm=lambda x, w: LigerRMSNormFunction.apply(x, w, EPS), silu_mul=LigerSiLUMulFunction.apply,
                rope=liger_rotary_pos_emb, ce=lambda l, t: LigerCrossEntropyFunction.apply(l, t)[0])


def qkv_case(cfg, M, dev, dt, g):
    d, Fi, hq, hkv, hd = cfg
    r = lambda *s, std=0.02: (torch.randn(*s, device=dev, generator=g) * std).to(dt).requires_grad_()  # noqa: E731
    x, gamma = r(M, d, std=3.0), (1 + 0.1 * torch.randn(d, device=dev, generator=g)).to(dt).requires_grad_()
    wq, wk, wv = r(hq * hd, d), r(hkv * hd, d), r(hkv * hd, d)
    pos = torch.arange(M, device=dev) % 8192
    inv = 1.0 / 500000.0 ** (torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd)
    ang = pos[:, None].float() * inv
    cos, sin = torch.cat((ang, ang), -1).cos().to(dt)[None], torch.cat((ang, ang), -1).sin().to(dt)[None]
    w_qkv = coda.layout.qkv_weight(wq, wk, wv, hd).detach().requires_grad_()
    n = (hf_rms_norm(x, gamma)).detach().requires_grad_()
    lg = liger()

    def torch_fn(norm=hf_rms_norm, rope=None):
        def f():
            h = norm(x, gamma)
            q = (h @ wq.T).view(1, M, hq, hd).transpose(1, 2)
            k = (h @ wk.T).view(1, M, hkv, hd).transpose(1, 2)
            v = (h @ wv.T).view(1, M, hkv, hd).transpose(1, 2)
            if rope:
                q, k = rope(q, k, cos, sin)
            else:
                q, k = q * cos[:, None] + rotate_half(q) * sin[:, None], k * cos[:, None] + rotate_half(k) * sin[:, None]
            return q, k, v
        return f

    impls = {
        "coda": lambda: (coda.ops.rmsnorm_qkv_rope(x, gamma, w_qkv, pos, inv, hq, hkv, hd, EPS),),
        "gemm_only": lambda: (n @ w_qkv.T,),
        "eager": torch_fn(),
        "compile": torch.compile(torch_fn(), fullgraph=True),
    }
    if lg and is_cuda(dev):
        impls["liger"] = torch_fn(lg["norm"], lg["rope"])
    return impls


def mlp_case(cfg, M, dev, dt, g):
    d, Fi, hq, hkv, hd = cfg
    r = lambda *s, std=0.02: (torch.randn(*s, device=dev, generator=g) * std).to(dt).requires_grad_()  # noqa: E731
    x, gamma = r(M, d, std=3.0), (1 + 0.1 * torch.randn(d, device=dev, generator=g)).to(dt).requires_grad_()
    wg, wu, wd = r(Fi, d), r(Fi, d), r(d, Fi)
    w_gu = coda.layout.interleave_gate_up(wg, wu).detach().requires_grad_()
    n = hf_rms_norm(x, gamma).detach().requires_grad_()
    y = (F.silu(n @ wg.T) * (n @ wu.T)).detach().requires_grad_()
    lg = liger()

    def torch_fn(norm=hf_rms_norm, silu_mul=None):
        def f():
            h = norm(x, gamma)
            a, b = h @ wg.T, h @ wu.T
            return (x + (silu_mul(a, b) if silu_mul else F.silu(a) * b) @ wd.T,)
        return f

    impls = {
        "coda": lambda: (coda.ops.swiglu_mlp(x, gamma, w_gu, wd, EPS)[0],),
        "gemm_only": lambda: (n @ w_gu.T, y @ wd.T),
        "eager": torch_fn(),
        "compile": torch.compile(torch_fn(), fullgraph=True),
    }
    if lg and is_cuda(dev):
        impls["liger"] = torch_fn(lg["norm"], lg["silu_mul"])
    return impls


def ce_case(cfg, M, dev, dt, g, V=128256):
    if dev == "cpu":
        V = 512
    logits = (torch.randn(M, V, device=dev, generator=g) * 3).to(dt).requires_grad_()
    t = torch.randint(0, V, (M,), device=dev, generator=g)
    ce = lambda: (F.cross_entropy(logits.float(), t),)  # noqa: E731
    impls = {"coda": lambda: (coda.ops.cross_entropy(logits, t),), "eager": ce,
             "compile": torch.compile(ce, fullgraph=True)}
    lg = liger()
    if lg and is_cuda(dev):
        impls["liger"] = lambda: (lg["ce"](logits, t),)
    return impls


CASES = {"qkv_rope": qkv_case, "swiglu_mlp": mlp_case, "cross_entropy": ce_case}


def prepare(fn, reps, dev):
    """Warms fn up (its first call also draws the output gradients) and returns measure(): one timing round."""
    outs = fn()
    grads = [torch.randn_like(o) for o in outs]

    def fb():
        o = fn()
        torch.autograd.backward(o, grads)

    def fwd():
        o = fn()
        del o

    def measure():
        t_f, t_fb = timed(fwd, reps, 2, dev), timed(fb, reps, 2, dev)
        return dict(forward_ms=t_f, fwd_bwd_ms=t_fb)
    return measure


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--configs", default="llama3-1b,llama3-8b,llama3-70b")
    p.add_argument("--ops", default=",".join(CASES))
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--reps", type=int, default=5, help="calls per timing per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path)
    p.add_argument("--commit", default="unknown")
    a = p.parse_args()
    dev = a.device
    dt = torch.bfloat16 if is_cuda(dev) else torch.float32
    rows = []
    for cname in a.configs.split(","):
        for op in a.ops.split(","):
            g = torch.Generator(device=dev).manual_seed(0)
            impls = CASES[op](CONFIGS[cname], a.tokens, dev, dt, g)
            measures, errors = {}, {}
            for name, fn in impls.items():
                try:
                    measures[name] = prepare(fn, a.reps, dev)
                except Exception as e:  # reported, never hidden
                    errors[name] = f"{type(e).__name__}: {e}"[:300]
            times = interleaved(measures, a.rounds)  # the implementations take turns: see common.interleaved
            base = times.get("coda") if "error" not in times.get("coda", {"error": 1}) else None
            for name in impls:
                r = dict(times.get(name) or {"error": errors.get(name, "not run")})
                if "error" not in r:  # from the medians, so that fwd + bwd = f+b
                    r["backward_ms"] = r["fwd_bwd_ms"] - r["forward_ms"]
                r.update(op=op, config=cname, tokens=a.tokens, impl=name, commit=a.commit,
                         gpu=torch.cuda.get_device_name() if is_cuda(dev) else "cpu")
                if base and "error" not in r:
                    r["fwd_bwd_vs_coda"] = r["fwd_bwd_ms"] / base["fwd_bwd_ms"]
                    r["forward_vs_coda"] = r["forward_ms"] / base["forward_ms"]
                rows.append(r)
                print(json.dumps(r), flush=True)
            del impls
            if is_cuda(dev):
                torch.cuda.empty_cache()
    append_jsonl(a.out, rows)
    print("| op | config | impl | fwd ms | f+b ms | fwd vs CODA | f+b vs CODA |")
    print("|---|---|---|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['op']} | {r['config']} | {r['impl']} | error: {r['error'][:70]} | | | |")
        else:
            print(f"| {r['op']} | {r['config']} | {r['impl']} | {r['forward_ms']:.3f} | {r['fwd_bwd_ms']:.3f} | "
                  f"{r.get('forward_vs_coda', float('nan')):.3f} | {r.get('fwd_bwd_vs_coda', float('nan')):.3f} |")


if __name__ == "__main__":
    main()
