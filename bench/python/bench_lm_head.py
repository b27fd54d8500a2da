"""LM head + cross-entropy benchmark (issue 7): final RMSNorm + LM head + loss, forward+backward, at llama3-1B
(d = 2048, V = 128256): CODA's linear_cross_entropy vs PyTorch eager (materialised logits), torch.compile of it,
and Liger's fused linear cross-entropy (with Liger's RMSNorm before it). Time: --rounds rounds, in each every
implementation in turn times --reps calls (CUDA events around each, median); median over rounds (why they take
turns: common.interleaved). Peak memory above the inputs (torch.cuda.max_memory_allocated) of one forward+backward.
--device cpu with small --tokens/--vocab is a smoke test (wall clock, no Liger).
--coda-variant LABEL=SPEC and --coda-env LABEL=VAR=VALUE add `coda:LABEL`, CODA with CODA_OP_CONFIG=SPEC or the
CODA_* variable VAR=VALUE set around its calls (as in bench_block.py), e.g. `cublas=CODA_GEMM_CONFIG=cublas` for
the weight gradient's plain GEMMs on cuBLAS. --coda-chunk-rows N[,N...] adds `coda:chunkN`, CODA with
chunk_rows=N (tokens per fused GEMM chunk; the default is the library's).

    python bench/python/bench_lm_head.py --tokens 8192 --out bench/results/lm_head_torch.jsonl
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from common import (EPS, append_jsonl, env_vars, hf_rms_norm, interleaved, is_cuda, parse_variants, peak_extra_gib,
                    profile, timed)

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
    p.add_argument("--impls", default="coda,eager,compile,liger", help="comma-separated, of: coda, eager, compile, liger")
    p.add_argument("--reps", type=int, default=5, help="calls per timing per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path)
    p.add_argument("--commit", default="unknown")
    p.add_argument("--profile", action="store_true", help="also print where each implementation's time goes on the GPU timeline")
    p.add_argument("--coda-variant", action="append", default=[], metavar="LABEL=SPEC",
                   help="add implementation coda:LABEL, CODA run with CODA_OP_CONFIG=SPEC (repeatable)")
    p.add_argument("--coda-env", action="append", default=[], metavar="LABEL=VAR=VALUE",
                   help="add implementation coda:LABEL, CODA run with the CODA_* variable VAR=VALUE (repeatable)")
    p.add_argument("--coda-chunk-rows", default="", metavar="N[,N...]",
                   help="add implementations coda:chunkN, CODA with chunk_rows=N")
    a = p.parse_args()
    variants = parse_variants(a.coda_variant, a.coda_env, p.error)
    try:
        chunks = [int(n) for n in a.coda_chunk_rows.split(",") if n]
    except ValueError:
        p.error(f"--coda-chunk-rows {a.coda_chunk_rows!r}: expected positive integers separated by commas")
    if any(n <= 0 for n in chunks):
        p.error(f"--coda-chunk-rows {a.coda_chunk_rows!r}: chunk sizes must be >= 1")
    chunks = list(dict.fromkeys(chunks))  # each size once
    taken = [f"coda:chunk{n}" for n in chunks if f"coda:chunk{n}" in variants]
    if taken:
        p.error(f"--coda-chunk-rows: {', '.join(taken)} is also a --coda-variant/--coda-env label")
    wanted = a.impls.split(",")
    unknown = [i for i in wanted if i not in ("coda", "eager", "compile", "liger")]
    if unknown:
        p.error(f"--impls: unknown {', '.join(unknown)}; the implementations are coda, eager, compile, liger")
    dev = a.device
    cuda = is_cuda(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    M, d, V = a.tokens, a.hidden, a.vocab
    x = (torch.randn(M, d, device=dev, generator=gen) * 3).bfloat16().requires_grad_()
    g = (1 + 0.1 * torch.randn(d, device=dev, generator=gen)).bfloat16().requires_grad_()
    w = (0.02 * torch.randn(V, d, device=dev, generator=gen)).bfloat16().requires_grad_()
    t = torch.randint(0, V, (M,), device=dev, generator=gen)
    available = impls()
    fns = {i: available[i] for i in wanted if i in available}  # liger only when installed (impls() says so)
    fns.update({label: available["coda"] for label in variants})
    for n in chunks:
        fns[f"coda:chunk{n}"] = lambda x, g, w, t, n=n: coda.ops.linear_cross_entropy(x, g, w, t, EPS, chunk_rows=n)
    measures, info, errors = {}, {}, {}
    for name, fn in fns.items():  # loss and peak memory of each, then the timings taking turns
        def step(fn=fn, env=variants.get(name)):
            with env_vars(env):
                loss = fn(x, g, w, t)
                loss.backward()
            x.grad = g.grad = w.grad = None
            return loss

        def forward(fn=fn, env=variants.get(name)):
            with torch.no_grad(), env_vars(env):
                fn(x, g, w, t)

        def measure(step=step, forward=forward):
            return dict(forward_ms=timed(forward, a.reps, device=dev), fwd_bwd_ms=timed(step, a.reps, device=dev))
        try:
            loss = step().item()
            peak = peak_extra_gib(step) if cuda else None  # not measured on the CPU
            info[name] = dict(peak_extra_gib=peak, loss=loss, calls=(forward, step))
            measures[name] = measure
        except Exception as e:
            errors[name] = f"{type(e).__name__}: {e}"[:300]
    times = interleaved(measures, a.rounds)
    rows = []
    for name in fns:
        r = dict(impl=name, **(times.get(name) or {"error": errors.get(name, "not run")}))
        if "error" not in r:
            r.update(peak_extra_gib=info[name]["peak_extra_gib"], loss=info[name]["loss"])
        r.update(tokens=M, hidden=d, vocab=V, commit=a.commit, gpu=torch.cuda.get_device_name() if cuda else "cpu")
        rows.append(r)
        print(json.dumps(r), flush=True)
    if a.profile and cuda:
        for name, i in info.items():
            profile(f"{name} forward (no grad)", i["calls"][0])
            profile(f"{name} forward+backward", i["calls"][1])
    base = next((r for r in rows if r["impl"] == "coda" and "error" not in r), None)
    append_jsonl(a.out, rows)
    print("| impl | fwd ms | f+b ms | f+b time / CODA's | peak extra GiB | loss |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['impl']} | error: {r['error'][:80]} |")
        else:
            ratio = r["fwd_bwd_ms"] / base["fwd_bwd_ms"] if base else float("nan")
            peak = "-" if r["peak_extra_gib"] is None else f"{r['peak_extra_gib']:.2f}"
            print(f"| {r['impl']} | {r['forward_ms']:.2f} | {r['fwd_bwd_ms']:.2f} | {ratio:.3f} | {peak} | "
                  f"{r['loss']:.5f} |")


if __name__ == "__main__":
    main()
