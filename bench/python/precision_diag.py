"""Precision diagnosis of patched HF Llama models (issue 24 items 3 and 4), on the GPU.

For each model: float64 CPU reference (the same dtype-rounded weights), unpatched HF in the dtype on the GPU
('unfused'), and coda.patch_llama in the dtype on the GPU. Prints, per parameter gradient, max-abs errors against
float64 and their ratio coda / unfused (the acceptance rule's bound is 2); for the loss, the per-token losses'
mean signed error (bias) and mean |error| of each, and the mean loss's error. --loss-scale S multiplies the loss by
S before backward (as a GradScaler does) and divides the gradients by S.

    python bench/python/precision_diag.py --dtype float16 --loss-scale 1,4096 --out diag.json
"""
from __future__ import annotations

import argparse
import copy
import json
import sys

import torch
import torch.nn.functional as F

import coda

MODELS = {
    "h1024-v32000": dict(vocab_size=32000, hidden_size=1024, intermediate_size=2048, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, head_dim=128, tie_word_embeddings=False),
    "h1024-v32003": dict(vocab_size=32003, hidden_size=1024, intermediate_size=2048, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, head_dim=128, tie_word_embeddings=False),
    "h512-v4096": dict(vocab_size=4096, hidden_size=512, intermediate_size=1536, num_hidden_layers=3,
                       num_attention_heads=8, num_key_value_heads=4, head_dim=64, tie_word_embeddings=True),
}


def make(cfg_kw, seed):
    import transformers
    base = dict(rms_norm_eps=1e-5, max_position_embeddings=4096, rope_theta=500000.0)
    base.update(cfg_kw)
    torch.manual_seed(seed)
    m = transformers.LlamaForCausalLM(transformers.LlamaConfig(**base))
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.2 * torch.randn_like(p))
    return m


def token_losses(model, ids, labels, hf):
    """Per-token next-token losses (float64 on CPU), every position (ignored ones 0)."""
    with torch.no_grad():
        logits = model(input_ids=ids, **(dict(use_cache=False) if hf else {})).logits.double()
        t = F.pad(labels, (0, 1), value=-100)[..., 1:]
        rows = F.cross_entropy(logits.flatten(0, 1), t.flatten(), reduction="none", ignore_index=-100)
    return rows.cpu()


def loss_grads(model, ids, labels, scale, hf):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels, **(dict(use_cache=False) if hf else {}))
    (out.loss * scale).backward()
    return out.loss.detach().double().cpu(), {n: (p.grad.double() / scale).cpu() for n, p in model.named_parameters()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="float16,bfloat16")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--loss-scale", default="1,4096")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--tokens", type=int, default=256, help="sequence length (batch 2)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    rows = []
    for dname in a.dtype.split(","):
        dt = getattr(torch, dname)
        for mname in a.models.split(","):
            for seed in (int(s) for s in a.seeds.split(",")):
                base = make(MODELS[mname], seed).to(dt)
                V = base.config.vocab_size
                g = torch.Generator().manual_seed(100 + seed)
                ids = torch.randint(0, V, (2, a.tokens), generator=g)
                labels = ids.clone()
                labels[:, :10] = -100
                ref = copy.deepcopy(base).double()
                r_rows = token_losses(ref, ids, labels, True)
                l64, g64 = loss_grads(ref, ids, labels, 1.0, True)
                del ref
                hf = copy.deepcopy(base).cuda()
                cm = coda.patch_llama(copy.deepcopy(base).cuda())
                u_rows = token_losses(hf, ids.cuda(), labels.cuda(), True)
                c_rows = token_losses(cm, ids.cuda(), labels.cuda(), False)
                valid = F.pad(labels, (0, 1), value=-100)[..., 1:].flatten() != -100
                eu, ec = (u_rows - r_rows)[valid], (c_rows - r_rows)[valid]
                for scale in (float(s) for s in a.loss_scale.split(",")):
                    lu, gu = loss_grads(hf, ids.cuda(), labels.cuda(), scale, True)
                    lc, gc = loss_grads(cm, ids.cuda(), labels.cuda(), scale, False)
                    row = dict(dtype=dname, model=mname, seed=seed, loss_scale=scale,
                               loss_err_hf=abs(lu - l64).item(), loss_err_coda=abs(lc - l64).item(),
                               tok_bias_hf=eu.mean().item(), tok_bias_coda=ec.mean().item(),
                               tok_mae_hf=eu.abs().mean().item(), tok_mae_coda=ec.abs().mean().item(),
                               tok_max_hf=eu.abs().max().item(), tok_max_coda=ec.abs().max().item(), grads={})
                    for n in g64:
                        e_u = (gu[n] - g64[n]).abs().max().item()
                        e_c = (gc[n] - g64[n]).abs().max().item()
                        row["grads"][n] = dict(hf=e_u, coda=e_c, ratio=e_c / max(e_u, 1e-30),
                                               scale=g64[n].abs().max().item(),
                                               tiny_frac=(g64[n].abs() < 6.1e-5).double().mean().item())
                    rows.append(row)
                    bad = {n: v for n, v in row["grads"].items() if v["ratio"] > 2}
                    print(f"{dname} {mname} seed {seed} scale {scale:g}: loss err hf {row['loss_err_hf']:.3e} "
                          f"coda {row['loss_err_coda']:.3e} | token bias hf {row['tok_bias_hf']:+.3e} coda "
                          f"{row['tok_bias_coda']:+.3e} mae hf {row['tok_mae_hf']:.3e} coda {row['tok_mae_coda']:.3e}"
                          f" | grads over 2x: {len(bad)}/{len(row['grads'])}")
                    for n, v in sorted(bad.items(), key=lambda kv: -kv[1]["ratio"])[:8]:
                        print(f"    {n}: ratio {v['ratio']:.2f} (coda {v['coda']:.2e} hf {v['hf']:.2e} "
                              f"max|g| {v['scale']:.2e}, {100 * v['tiny_frac']:.0f}% below fp16 normal)")
                del hf, cm
                torch.cuda.empty_cache()
    if a.out:
        with open(a.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    sys.exit(main())
