"""End-to-end training step (issue 7): a llama3-1B-shaped causal LM, B x S tokens per step, forward + backward
(and optionally AdamW), CODA against Hugging Face transformers eager, torch.compile'd and Liger-patched. The
qwen3-* shapes run HF's Qwen3ForCausalLM instead (QK-norm: coda-patched is coda.patch_qwen3, hf-liger
apply_liger_kernel_to_qwen3; CODA has no native Qwen3 model, so their default impls leave out `coda`).

    python bench/python/bench_e2e.py --batch 4 --seq 8192 --out bench/results/e2e.jsonl
    python bench/python/bench_e2e.py --shape qwen3-1.7b --batch 4 --seq 4096

Implementations (all bf16 parameters and compute, SDPA attention, the same initial weights and batch):
  coda          coda.models.llama.LlamaForCausalLM (weights held in CODA's layouts)
  coda-patched  transformers' model after coda.patch_llama (HF layouts, gathered per step)
  hf            transformers' LlamaForCausalLM, eager
  hf-compile    torch.compile of it (whole model: HF then builds an explicit causal mask, see build())
  hf-compile-layers  each decoder layer compiled (regional compilation), embeddings, final norm and loss eager
  hf-liger      liger_kernel.transformers.apply_liger_kernel_to_llama on it. Liger also patches transformers'
                modeling_llama module (its apply_rotary_pos_emb, looked up at call time), so run() restores that
                module after the hf-liger run: the HF baselines measured after it in a round stay plain HF.
Reported: median step time over --steps after --warmup, tokens/s, peak memory (torch.cuda.max_memory_allocated),
and the first step's loss (same weights and batch for all: the losses must agree to bf16 noise).
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import time
from pathlib import Path

import torch

import common  # noqa: F401  (puts the checkout's python/ on the path)
import coda  # noqa: E402

SHAPES = {
    "llama3-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=64),
    "tiny": dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=64),
    # Qwen3-1.7B's shape (config.json of Qwen/Qwen3-1.7B: tied embeddings, rms_norm_eps 1e-6, rope_theta 1e6).
    "qwen3-1.7b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128),
    "qwen3-tiny": dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=64),
}
DEFAULT_IMPLS = "coda,coda-patched,hf,hf-compile,hf-compile-layers,hf-liger"
QWEN3_IMPLS = "coda-patched,hf,hf-compile,hf-compile-layers,hf-liger"


def is_qwen3(shape):
    return shape.startswith("qwen3")


def hf_model(shape, device, dtype, layers=None):
    import transformers
    kw = dict(SHAPES[shape])
    if layers:
        kw["num_hidden_layers"] = layers
    torch.manual_seed(0)
    if is_qwen3(shape):
        cfg = transformers.Qwen3Config(**kw, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
                                       max_position_embeddings=40960, attn_implementation="sdpa", use_cache=False,
                                       use_sliding_window=False)
        return transformers.Qwen3ForCausalLM(cfg).to(device, dtype)
    cfg = transformers.LlamaConfig(**kw, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
                                   max_position_embeddings=131072, attn_implementation="sdpa", use_cache=False)
    return transformers.LlamaForCausalLM(cfg).to(device, dtype)


def build(impl, base, device, dtype):
    """-> (model, step_fn(ids) -> loss)."""
    qwen3 = base.config.model_type == "qwen3"
    if impl == "coda":
        if qwen3:
            raise ValueError("coda: no native Qwen3 model (coda.models.llama is LLaMA's); use coda-patched")
        m = coda.models.llama.LlamaForCausalLM(coda.models.llama.LlamaConfig.from_hf(base.config), dtype=dtype,
                                               device=device)
        m.load_state_dict(base.state_dict())
        return m, lambda ids: m(ids, labels=ids).loss
    m = copy.deepcopy(base)
    if impl == "coda-patched":
        (coda.patch_qwen3 if qwen3 else coda.patch_llama)(m)
        return m, lambda ids: m(input_ids=ids, labels=ids).loss
    if impl == "hf":
        return m, lambda ids: m(input_ids=ids, labels=ids, use_cache=False).loss
    if impl == "hf-compile":
        c = torch.compile(m)
        return m, lambda ids: c(input_ids=ids, labels=ids, use_cache=False).loss
    if impl == "hf-compile-layers":
        # Regional compilation (each decoder layer compiled, the rest eager), as PyTorch recommends for HF models.
        # Under a whole-model compile HF builds an explicit causal mask (dynamo traces the mask creation), so SDPA
        # gets attn_mask + is_causal=False and cannot use flash attention; eager HF and the per-layer compile pass
        # attention_mask=None + is_causal=True.
        for layer in m.model.layers:
            layer.compile()
        return m, lambda ids: m(input_ids=ids, labels=ids, use_cache=False).loss
    if impl == "hf-liger":
        from liger_kernel import transformers as liger
        apply = liger.apply_liger_kernel_to_qwen3 if qwen3 else liger.apply_liger_kernel_to_llama
        apply(rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=True, model=m)
        return m, lambda ids: m(input_ids=ids, labels=ids, use_cache=False).loss
    raise ValueError(impl)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def run(impl, base, ids, args, device, dtype):
    if impl != "hf-liger":
        return run_built(impl, base, ids, args, device, dtype)
    if base.config.model_type == "qwen3":
        from transformers.models.qwen3 import modeling_qwen3 as module
    else:
        from transformers.models.llama import modeling_llama as module
    saved = dict(vars(module))
    try:
        return run_built(impl, base, ids, args, device, dtype)
    finally:  # undo Liger's module-level patches
        for k in [k for k in vars(module) if k not in saved]:
            delattr(module, k)
        for k, v in saved.items():
            if vars(module).get(k) is not v:
                setattr(module, k, v)


def run_built(impl, base, ids, args, device, dtype):
    model, step = build(impl, base, device, dtype)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda") if args.optimizer else None
    first_loss, times = None, []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sampler = common.GpuSampler()

    def one_training_step(i):
        sync(device)
        t0 = time.perf_counter()
        loss = step(ids)
        loss.backward()
        if opt:
            opt.step()
        model.zero_grad(set_to_none=True)
        sync(device)
        if i >= max(args.warmup, 1):
            times.append(time.perf_counter() - t0)
        return loss
    warmup = max(args.warmup, 1)  # the first step (compilation, autotuning) is never timed
    first_loss = one_training_step(0).float().item()
    for i in range(1, warmup):
        one_training_step(i)
    with sampler:  # the GPU's clock and power during the timed steps
        for i in range(warmup, warmup + args.steps):
            one_training_step(i)
    t = statistics.median(times)
    if args.profile and device.type == "cuda":
        def one_step():
            step(ids).backward()
            model.zero_grad(set_to_none=True)
        common.profile(f"{impl} training step", one_step, reps=1, rows=25)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    del model, opt, step
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return dict(impl=impl, step_ms=1e3 * t, tokens_per_s=ids.numel() / t, peak_mem_gib=peak, first_loss=first_loss,
                **sampler.summary())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama3-1b")
    p.add_argument("--layers", type=int, default=None, help="override the number of layers")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--impls", default=None,
                   help=f"comma-separated (default: {DEFAULT_IMPLS}; for the qwen3 shapes {QWEN3_IMPLS})")
    p.add_argument("--optimizer", action="store_true", help="include AdamW's step in the timed step")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=1,
                   help="run the implementations this many times, the order rotated by one each time; median")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path)
    p.add_argument("--commit", default="unknown")
    p.add_argument("--profile", action="store_true",
                   help="also print where one step's time goes on the GPU timeline (after the timed steps)")
    args = p.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    base = hf_model(args.shape, device, dtype, args.layers)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, base.config.vocab_size, (args.batch, args.seq), generator=g).to(device)
    impls = (args.impls or (QWEN3_IMPLS if is_qwen3(args.shape) else DEFAULT_IMPLS)).split(",")
    runs = {impl: [] for impl in impls}
    for rnd in range(args.rounds):  # the order rotated by one per round: see common.interleaved
        for j in range(len(impls)):
            impl = impls[(rnd + j) % len(impls)]
            if runs[impl] and "error" in runs[impl][-1]:
                continue
            try:
                r = run(impl, base, ids, args, device, dtype)
            except Exception as e:  # reported in the table, never hidden
                r = dict(impl=impl, error=f"{type(e).__name__}: {e}"[:300])
            gc.collect()  # out here the exception's traceback (and the failed model it holds) is gone
            if device.type == "cuda":
                torch.cuda.empty_cache()
            r["round"] = rnd
            runs[impl].append(r)
            print(json.dumps(r), flush=True)
    rows = []
    for impl in impls:
        got = runs[impl]
        if any("error" in r for r in got):
            r = next(r for r in got if "error" in r)
        else:  # median step over rounds; the peak is the largest; telemetry averaged
            r = dict(got[0])
            r["step_ms"] = statistics.median(x["step_ms"] for x in got)
            r["tokens_per_s"] = ids.numel() / (r["step_ms"] / 1e3)
            r["peak_mem_gib"] = None if got[0]["peak_mem_gib"] is None else max(x["peak_mem_gib"] for x in got)
            r["step_ms_rounds"] = [x["step_ms"] for x in got]
            for k, agg in (("sm_clock_mhz", statistics.mean), ("power_w", statistics.mean),
                           ("sm_clock_min_mhz", min), ("power_max_w", max), ("temp_max_c", max),
                           ("telemetry_samples", sum)):
                if all(k in x for x in got):
                    r[k] = agg(x[k] for x in got)
                else:
                    r.pop(k, None)
            r.pop("round", None)
        r.update(shape=args.shape, layers=base.config.num_hidden_layers, batch=args.batch, seq=args.seq,
                 optimizer=args.optimizer, commit=args.commit, rounds=len(got),
                 gpu=torch.cuda.get_device_name() if device.type == "cuda" else "cpu")
        rows.append(r)
    ref = next((r for want in ("coda", "coda-patched") for r in rows if r["impl"] == want and "error" not in r), None)
    common.append_jsonl(args.out, rows)
    name = ref["impl"] if ref else "CODA"
    print(f"| impl | step ms | tokens/s | {name}'s tokens/s over it | peak GiB | first loss | SM MHz, W |  "
          f"({args.shape}, {args.batch} x {args.seq}{', AdamW' if args.optimizer else ''})")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['impl']} | error: {r['error'][:90]} |")
            continue
        ratio = ref["tokens_per_s"] / r["tokens_per_s"] if ref else float("nan")
        tele = f"{r['sm_clock_mhz']:.0f}, {r['power_w']:.0f}" if "sm_clock_mhz" in r else "-"
        peak = "-" if r["peak_mem_gib"] is None else f"{r['peak_mem_gib']:.1f}"
        print(f"| {r['impl']} | {r['step_ms']:.1f} | {r['tokens_per_s']:,.0f} | {ratio:.3f} | {peak} | "
              f"{r['first_loss']:.5f} | {tele} |")


if __name__ == "__main__":
    main()
