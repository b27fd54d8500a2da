"""The LM head's dW GEMM (an fp32 wgrad that adds into dW chunk after chunk: dW[V, d] += E^T a, K = the chunk's
rows) under sustained load: the autotuned pick, each config of --pins pinned (CODA_GEMM_CONFIG, read on every
call; `cublas` is coda_gemm's cuBLAS path), and cuBLAS's bf16 GEMM of the same shape (torch.mm, no accumulation:
the issue's baseline).

    python bench/python/wgrad_accumulate_ab.py --vocab 128256 --hidden 2048 --chunk 2048,4096 --out DIR

Method: vs_quack.py's (each contender warmed --warm-s s back to back, then --rounds interleaved rounds of ~150 ms
timings with the SM clock and board power sampled). Every contender adds into its own fp32 dW (which grows by the
same product each call; fp32 holds it). Each one's first call from the same dW is compared bit for bit with the
beta = 1 kernel's (pp_128x128x64_c2x1: one fp32 add per element in each). Writes --out/wgrad_ab.jsonl and prints
a table.
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from bench_gemm import coda_gemm_call  # noqa: E402
from common import append_jsonl, env_var, interleaved, last_gemm_choice, warm_for  # noqa: E402
from vs_quack import reps_for, timing  # noqa: E402

from coda import _C  # noqa: E402

PINS = ("pp_128x128x64_c2x1", "sk_128x256x64_c2x1", "cublas")


def gemm_call(A, B, D, dev, pin):
    """coda_gemm D += A B^T with CODA_GEMM_CONFIG=pin for the call ('' = autotuned)."""
    call = coda_gemm_call(A, B, D, dev, _C.stream(dev), accumulate=True)

    def pinned():
        with env_var("CODA_GEMM_CONFIG", pin or None):
            call()
        return D
    return pinned


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--chunk", default="2048,4096", help="rows per chunk (the GEMM's K), comma-separated")
    p.add_argument("--pins", default=",".join(PINS))
    p.add_argument("--warm-s", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--timing-ms", type=float, default=150.0)
    p.add_argument("--commit", default="?")
    p.add_argument("--out", type=Path, default=Path("."))
    a = p.parse_args(argv)
    dev = torch.device("cuda")
    V, d = a.vocab, a.hidden
    meta = dict(commit=a.commit, gpu=torch.cuda.get_device_name(dev), torch=torch.__version__,
                date=datetime.datetime.now().isoformat(timespec="seconds"))
    rows = []
    for C in [int(c) for c in a.chunk.split(",")]:
        g = torch.Generator(device=dev).manual_seed(C)
        E = torch.randn(C, V, device=dev, generator=g).bfloat16()  # the chunk's [C, V] (logits' layout)
        act = torch.randn(C, d, device=dev, generator=g).bfloat16()
        base = torch.randn(V, d, device=dev, generator=g)
        fns, outs, choice = {}, {}, {}
        bf = torch.empty(V, d, device=dev, dtype=torch.bfloat16)
        fns["cublas_gemm"] = lambda: torch.mm(E.t(), act, out=bf)
        for pin in [""] + [x for x in a.pins.split(",") if x]:
            D = base.clone()
            fn = gemm_call(E.t(), act.t(), D, dev, pin)
            name = f"coda:{pin}" if pin else "coda"
            try:
                fn()
                torch.cuda.synchronize()
            except Exception as e:  # a pin that cannot run this problem
                rows.append({"chunk": C, "V": V, "d": d, "impl": name, "error": f"{type(e).__name__}: {e}"[:300],
                             **meta})
                continue
            outs[name] = D.clone()
            fns[name] = fn
            choice[name] = last_gemm_choice()
        ref = outs.get("coda:pp_128x128x64_c2x1")
        measures, info = {}, {}
        for name, fn in fns.items():
            per_call = warm_for(fn, a.warm_s, dev)
            measures[name] = timing(fn, reps_for(per_call, a.timing_ms / 1e3, 3), dev)
            info[name] = {"same_as_pp_128x128": None if ref is None or name not in outs
                          else bool(torch.equal(outs[name], ref)), "gemm_choice": choice.get(name)}
        got = interleaved(measures, a.rounds)
        for name, r in got.items():
            rows.append({"chunk": C, "V": V, "d": d, "impl": name, **r, **info.get(name, {}), **meta})
        fns = outs = measures = None
        torch.cuda.empty_cache()
    out = a.out / "wgrad_ab.jsonl"
    out.unlink(missing_ok=True)
    append_jsonl(out, rows)
    print("| chunk | impl | kernel | ms | / cublas_gemm | clock MHz | W | same bits |")
    print("|---:|---|---|---:|---:|---:|---:|---|")
    for C in sorted({r["chunk"] for r in rows}):
        cb = next((r.get("ms") for r in rows if r["chunk"] == C and r["impl"] == "cublas_gemm"), None)
        for r in [r for r in rows if r["chunk"] == C]:
            if "error" in r:
                print(f"| {C} | {r['impl']} | | error: {r['error'][:80]} | | | | |")
                continue
            ratio = f"{r['ms'] / cb:.3f}" if cb else "-"
            print(f"| {C} | {r['impl']} | {r.get('gemm_choice') or '-'} | {r['ms']:.3f} | {ratio} | "
                  f"{r.get('clock_mhz', 0):.0f} | {r.get('watts', 0):.0f} | {r.get('same_as_pp_128x128')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
