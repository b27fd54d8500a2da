"""Block-level benchmark (issue 7, PROTOCOL.md): the CODA block (layer i's o-projection, MLP norm, SwiGLU MLP and
layer i+1's norm + q/k/v + RoPE; attention excluded) forward, backward and forward+backward against the same block
in PyTorch eager (HF style), torch.compile of it, and with Liger Kernel's RMSNorm / SwiGLU / RoPE.

    python bench/python/bench_block.py --configs llama3-1b:8192,llama3-1b:32768,llama3-8b:8192,llama3-70b:8192 \
        --out bench/results/block_torch.jsonl

Timing: --rounds rounds; in each, every implementation in turn (the order rotated by one per round) times --reps
calls each synchronized (CUDA events around each call, median) and --reps back-to-back calls (events around the
loop); the result is the median over rounds. Taking turns matters on the H200: see common.interleaved.
backward = (forward+backward) - forward. Peak memory: torch.cuda.max_memory_allocated above the inputs during one
forward+backward. --device cpu runs the tiny config for a smoke test (wall clock; no Liger, no profile).
Each line of --out is one (config, tokens, implementation) with times in ms and the ratios to CODA.

--qk-norm: layer i+1's attention has Qwen3's QK-norm (a per-head RMSNorm of q and k before RoPE): every implementation
normalises the heads (HF: q_norm / k_norm on [.., heads, head_dim]); CODA's block takes q_gamma / k_gamma (block.h
version 2). The rows say qk_norm: true.

--coda-variant LABEL=SPEC (repeatable) adds an implementation `coda:LABEL`: the CODA block with CODA_OP_CONFIG=SPEC
set around each of its calls (SPEC's per-op form pins single fused ops, e.g.
`swiglu=linear_rowscale_swiglu=coop_128x256x64_c2x1:raster=m,swizzle=8`), so that one op's config is A/B-tested in the
block, taking turns with the default, rather than in isolation (docs/FUSED_OPS.md, "Choosing and pinning a kernel").
--coda-env LABEL=VAR=VALUE (repeatable) sets any CODA_* variable for `coda:LABEL` the same way, e.g.
`cublas=CODA_GEMM_CONFIG=cublas` runs the block's plain GEMMs (the weight gradients, dy0) on cuBLAS; a label given
to both options gets all of its variables.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from common import (CONFIGS, EPS, append_jsonl, env_vars, hf_rms_norm, interleaved, is_cuda, parse_variants,
                    peak_extra_gib, profile, rotate_half, timed, timed_pipelined)

import coda

def torch_block(y0, x0, w, cos, sin, cfg, norm=hf_rms_norm, silu_mul=None, rope=None):
    """HF LlamaDecoderLayer's math from the attention output to the next layer's rotated q, k and v."""
    d, Fi, hq, hkv, hd = cfg
    x1 = y0 @ w["o"].T + x0
    n1 = norm(x1, w["g1"])
    gate, up = n1 @ w["gate"].T, n1 @ w["up"].T
    y1 = silu_mul(gate, up) if silu_mul else F.silu(gate) * up
    x2 = y1 @ w["down"].T + x1
    n2 = norm(x2, w["g2"])
    M = x0.shape[0]
    q, k = (n2 @ w["q"].T).view(1, M, hq, hd), (n2 @ w["k"].T).view(1, M, hkv, hd)
    if "qn" in w:  # Qwen3: per-head RMSNorm of q and k before RoPE
        q, k = norm(q, w["qn"]), norm(k, w["kn"])
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    v = (n2 @ w["v"].T).view(1, M, hkv, hd).transpose(1, 2)
    if rope:
        q, k = rope(q, k, cos, sin)
    else:
        c, s = cos[:, None], sin[:, None]
        q, k = q * c + rotate_half(q) * s, k * c + rotate_half(k) * s
    return x2, q, k, v


def liger_fns():
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    from liger_kernel.transformers.rope import liger_rotary_pos_emb
    return dict(norm=lambda x, w: LigerRMSNormFunction.apply(x, w, EPS),
                silu_mul=lambda a, b: LigerSiLUMulFunction.apply(a, b),
                rope=lambda q, k, c, s: liger_rotary_pos_emb(q, k, c, s))


def make(cfg, M, dtype=torch.bfloat16, seed=0, device="cuda", qk_norm=False):
    d, Fi, hq, hkv, hd = cfg
    g = torch.Generator(device=device).manual_seed(seed)
    r = lambda *s, std=0.02: (torch.randn(*s, device=device, generator=g) * std).to(dtype)  # noqa: E731
    w = dict(o=r(d, hq * hd), g1=1 + r(d, std=0.1), gate=r(Fi, d), up=r(Fi, d), down=r(d, Fi), g2=1 + r(d, std=0.1),
             q=r(hq * hd, d), k=r(hkv * hd, d), v=r(hkv * hd, d))
    if qk_norm:
        w.update(qn=1 + r(hd, std=0.1), kn=1 + r(hd, std=0.1))
    for t in w.values():
        t.requires_grad_()
    y0, x0 = r(M, hq * hd, std=1.0).requires_grad_(), r(M, d, std=4.0).requires_grad_()
    pos = torch.arange(M, device=device) % 8192
    inv = 1.0 / 500000.0 ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd)
    ang = pos[:, None].float() * inv[None]
    emb = torch.cat((ang, ang), -1)
    cos, sin = emb.cos().to(dtype)[None], emb.sin().to(dtype)[None]
    return w, y0, x0, pos, inv, cos, sin


def coda_runner(cfg, w, pos, inv):
    d, Fi, hq, hkv, hd = cfg
    L = coda.layout
    # CODA's layouts, built once (a model holds its weights this way: coda.models.llama)
    w_gu = L.interleave_gate_up(w["gate"], w["up"]).detach().requires_grad_()
    w_qkv = L.qkv_weight(w["q"], w["k"], w["v"], hd).detach().requires_grad_()
    params = [w["o"], w["g1"], w_gu, w["down"], w["g2"], w_qkv]
    qk = {}
    if "qn" in w:  # the paired layout, as coda.patch_qwen3 builds it
        qk = {f"{n}_gamma": L.pair_rope_rows(w[f"{n}n"], hd).detach().requires_grad_() for n in "qk"}
        params += list(qk.values())

    def fwd(y0, x0):
        return coda.ops.block(y0, x0, w["o"], w["g1"], w_gu, w["down"], w["g2"], w_qkv, pos, inv, hq, hkv, hd, EPS,
                              **qk)
    return fwd, params


def fwd_bwd_step(fwd, inputs, params):
    """One training step's block work as a call: forward, backward with upstream gradients drawn at the first call and
    kept, then the parameter and input gradients dropped (a step's zero_grad)."""
    grads_out = []

    def call():
        outs = fwd(*inputs)
        if not grads_out:
            grads_out.extend(torch.randn_like(o) for o in outs)
        torch.autograd.backward(outs, grads_out)
        for p in list(params) + list(inputs):
            p.grad = None
    return call


def prepare_impl(name, fwd, inputs, params, reps, device="cuda", env=None):
    """Warms fwd up, measures its peak memory, and returns (peak GiB, measure, profiled calls): measure() times it
    once (one round of common.interleaved). env: {VAR: value} set around every call, forward and backward (a
    variant's CODA_OP_CONFIG, CODA_GEMM_CONFIG, ...)."""
    cuda = is_cuda(device)
    fwd_bwd_call = fwd_bwd_step(fwd, inputs, params)

    def fwd_bwd():
        with env_vars(env):
            fwd_bwd_call()

    # the forward with autograd on (it saves what the backward needs) is what a training step runs
    def forward_train():
        with env_vars(env):
            outs = fwd(*inputs)
            del outs

    fwd_bwd()
    peak = peak_extra_gib(fwd_bwd) if cuda else None  # not measured on the CPU

    def measure():
        t_f = timed(forward_train, reps, device=device)
        t_fb = timed(fwd_bwd, reps, device=device)
        t_fb_pipe = timed_pipelined(fwd_bwd, reps, device=device)
        return dict(forward_ms=t_f, fwd_bwd_ms=t_fb, fwd_bwd_pipelined_ms=t_fb_pipe)
    return peak, measure, dict(forward=forward_train, fwd_bwd=fwd_bwd)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--configs", default="llama3-1b:8192,llama3-1b:32768,llama3-8b:8192,llama3-70b:8192")
    p.add_argument("--impls", default="coda,eager,compile,liger")
    p.add_argument("--reps", type=int, default=5, help="calls per timing per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--commit", default="unknown")
    p.add_argument("--profile", action="store_true", help="also print where each implementation's time goes on the GPU timeline")
    p.add_argument("--qk-norm", action="store_true", help="layer i+1 with Qwen3's QK-norm (every implementation)")
    p.add_argument("--coda-variant", action="append", default=[], metavar="LABEL=SPEC",
                   help="add implementation coda:LABEL, the CODA block run with CODA_OP_CONFIG=SPEC (repeatable)")
    p.add_argument("--coda-env", action="append", default=[], metavar="LABEL=VAR=VALUE",
                   help="add implementation coda:LABEL, the CODA block run with the CODA_* variable VAR=VALUE "
                        "(repeatable)")
    args = p.parse_args()
    impls = args.impls.split(",")
    variants = parse_variants(args.coda_variant, args.coda_env, p.error)
    impls += [k for k in variants if k not in impls]
    dev = args.device
    cuda = is_cuda(dev)
    gpu = torch.cuda.get_device_name() if cuda else "cpu"
    lines = []
    for item in args.configs.split(","):
        name, M = item.split(":")
        cfg, M = CONFIGS[name], int(M)
        w, y0, x0, pos, inv, cos, sin = make(cfg, M, device=dev, qk_norm=args.qk_norm)
        prepared, errors = {}, {}
        for impl in impls:  # build and warm every implementation, then time them taking turns
            try:
                if impl == "coda" or impl in variants:
                    fwd, params = coda_runner(cfg, w, pos, inv)
                elif impl == "eager":
                    fwd, params = (lambda a, b: torch_block(a, b, w, cos, sin, cfg)), list(w.values())
                elif impl == "compile":
                    fn = torch.compile(lambda a, b: torch_block(a, b, w, cos, sin, cfg), fullgraph=True)
                    fwd, params = fn, list(w.values())
                elif impl == "liger":
                    lf = liger_fns()
                    fwd, params = (lambda a, b: torch_block(a, b, w, cos, sin, cfg, **lf)), list(w.values())
                else:
                    raise ValueError(impl)
                prepared[impl] = prepare_impl(impl, fwd, [y0, x0], params, args.reps, dev, variants.get(impl))
            except Exception as e:  # report, do not hide: the line says what failed
                errors[impl] = f"{type(e).__name__}: {e}"[:300]
        times = interleaved({k: v[1] for k, v in prepared.items()}, args.rounds)
        rows = []
        for impl in impls:
            r = dict(impl=impl, **(times.get(impl) or {"error": errors.get(impl, "not run")}))
            if "error" not in r:  # backward from the medians, so that fwd + bwd = f+b in every row
                r["backward_ms"] = r["fwd_bwd_ms"] - r["forward_ms"]
                r["peak_extra_gib"] = prepared[impl][0]
            r.update(config=name, tokens=M, commit=args.commit, gpu=gpu, qk_norm=args.qk_norm)
            rows.append(r)
            print(json.dumps(r), flush=True)
        if args.profile and cuda:
            for impl, (_, _, calls) in prepared.items():
                profile(f"{impl} forward", calls["forward"])
                profile(f"{impl} forward+backward", calls["fwd_bwd"])
        base = next((r for r in rows if r["impl"] == "coda" and "error" not in r), None)
        for r in rows:
            if base and "error" not in r:
                for k in ("forward_ms", "backward_ms", "fwd_bwd_ms", "fwd_bwd_pipelined_ms"):
                    r[k.replace("_ms", "_vs_coda")] = r[k] / base[k]
        lines += rows
        del w, y0, x0, prepared
        if cuda:
            torch.cuda.empty_cache()
    append_jsonl(args.out, lines)
    print("| config | tokens | impl | fwd ms | bwd ms | f+b ms | f+b time / CODA's | f+b back-to-back ms | "
          "its time / CODA's | extra GiB |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in lines:
        if "error" in r:
            print(f"| {r['config']} | {r['tokens']} | {r['impl']} | error: {r['error'][:60]} |")
            continue
        print(f"| {r['config']} | {r['tokens']} | {r['impl']} | {r['forward_ms']:.2f} | {r['backward_ms']:.2f} | "
              f"{r['fwd_bwd_ms']:.2f} | {r.get('fwd_bwd_vs_coda', float('nan')):.3f} | "
              f"{r['fwd_bwd_pipelined_ms']:.2f} | {r.get('fwd_bwd_pipelined_vs_coda', float('nan')):.3f} | "
              f"{'-' if r['peak_extra_gib'] is None else format(r['peak_extra_gib'], '.2f')} |")


if __name__ == "__main__":
    main()
