"""Train a LLaMA-architecture model on a text corpus with CODA kernels (python -m coda.train).

    python -m coda.train                      # tinyshakespeare, byte tokens, small Llama-3-style model, 2000 steps
    python -m coda.train --compare            # CODA and plain PyTorch (HF transformers) from the same seed and data
                                              # order: both loss curves in one PNG and a summary table
    python -m coda.train --baseline torch --compile    # only the PyTorch baseline, torch.compile'd
    python -m coda.train --config llama3-1b --steps 50 --batch-size 4 --seq-len 8192   # throughput at 1B shape
    python -m coda.train --model qwen3 --compare  # a Qwen3-style model (QK-norm): HF's, patched (coda.patch_qwen3)
    torchrun --nproc-per-node 8 -m coda.train  # data parallel over 8 GPUs: FSDP2 (fully_shard per layer and root)

Every non-attention op of the CODA model (norms, projections with RoPE, SwiGLU MLP, residuals, LM head + loss, and
their backward passes) runs as a CODA kernel; attention is PyTorch's SDPA. Parameters are fp32 masters, compute is
bf16 (the baseline runs under torch.autocast(bfloat16)), AdamW. Output folder: losses (JSON lines), summary, plot,
tokenizer and an HF-compatible checkpoint (config.json + model.safetensors via transformers' save_pretrained).

Under torchrun each process trains on its own batches (--batch-size per process) with the model sharded by
torch.distributed.fsdp.fully_shard per decoder layer and at the root (bf16 parameters and compute, fp32 gradient
reduction). Rank 0 alone shows the progress bar and writes the logs, plot and checkpoint; the logged loss and the
validation loss are averaged over the processes.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

CONFIGS = {
    # For tests and --device cpu (CODA's float64 reference path): runs in seconds on a CPU.
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=64),
    # A small Llama-3-style model that trains in minutes on one H200.
    "small": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6,
                  num_key_value_heads=2, head_dim=64),
    # The llama3-1B (Llama-3.2-1B) shape, for throughput.
    "llama3-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=64),
}


def default_data() -> Path:
    """The corpus beside the repository (../shared/data), or its copy in .data/ (the GPU machine's)."""
    env = os.environ.get("CODA_DATA")
    here = Path(__file__).resolve().parents[2]
    for p in ([Path(env)] if env else []) + [here.parent / "shared" / "data" / "tinyshakespeare.txt",
                                             here / ".data" / "tinyshakespeare.txt",
                                             Path.cwd() / ".data" / "tinyshakespeare.txt"]:
        if p.exists():
            return p
    raise SystemExit("coda.train: no corpus found: pass --data FILE (any UTF-8 text file), or set CODA_DATA")


def tokenize(text: str, kind: str, vocab_size: int, out: Path, save: bool = True):
    """-> (token ids int64 tensor, vocabulary size, tokenizer or None). 'bpe' trains a byte-level BPE on the corpus
    (the `tokenizers` library) and saves it in out/ (when `save`: rank 0 only); 'byte' uses the UTF-8 bytes
    (vocabulary 256)."""
    if kind == "byte":
        return torch.tensor(list(text.encode("utf-8")), dtype=torch.int64), 256, None
    from tokenizers import ByteLevelBPETokenizer
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator([text], vocab_size=vocab_size, min_frequency=2, show_progress=False)
    if save:
        out.mkdir(parents=True, exist_ok=True)
        tok.save(str(out / "tokenizer.json"))
    ids = torch.tensor(tok.encode(text).ids, dtype=torch.int64)
    return ids, vocab_size, tok


def make_model(kind, cfg_name, vocab, seed, device, compile_, family="llama"):
    """CODA's model, or the identical HF LlamaForCausalLM loaded from its state dict (same initial weights). Family
    qwen3: HF's Qwen3ForCausalLM (QK-norm) of the same shape, patched with coda.patch_qwen3 for CODA (the same seed,
    so the same initial weights either way)."""
    if family == "qwen3":
        return _make_qwen3(kind, cfg_name, vocab, seed, device, compile_)
    from .models.llama import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=vocab, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
                      **CONFIGS[cfg_name])
    torch.manual_seed(seed)
    coda_model = LlamaForCausalLM(cfg, dtype=torch.float32, device=device)
    if kind == "coda":
        model = coda_model
    else:
        import transformers
        hf_cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=cfg.hidden_size,
                                          intermediate_size=cfg.intermediate_size,
                                          num_hidden_layers=cfg.num_hidden_layers,
                                          num_attention_heads=cfg.num_attention_heads,
                                          num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                                          rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
                                          tie_word_embeddings=True, max_position_embeddings=131072,
                                          attn_implementation="sdpa", use_cache=False)
        model = transformers.LlamaForCausalLM(hf_cfg).to(device)
        model.load_state_dict(coda_model.state_dict(), strict=True)
        del coda_model
    model.train()
    fwd = torch.compile(model) if compile_ else model
    return model, fwd, cfg


def _make_qwen3(kind, cfg_name, vocab, seed, device, compile_):
    import transformers

    from .hf import patch_qwen3
    cfg = transformers.Qwen3Config(vocab_size=vocab, rms_norm_eps=1e-6, rope_theta=1000000.0,
                                   tie_word_embeddings=True, max_position_embeddings=131072,
                                   attn_implementation="sdpa", use_cache=False, **CONFIGS[cfg_name])
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(cfg).to(device)
    if kind == "coda":
        patch_qwen3(model)
    model.train()
    fwd = torch.compile(model) if compile_ else model
    return model, fwd, cfg


class Dist:
    """This process's place in a torchrun job: rank, world size, device. Outside torchrun: rank 0 of 1, no
    process group."""

    def __init__(self, device_kind):
        self.on = "RANK" in os.environ and "WORLD_SIZE" in os.environ
        self.rank, self.world, local = 0, 1, int(os.environ.get("LOCAL_RANK", 0))
        if device_kind == "cuda":
            torch.cuda.set_device(local)
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        if self.on:
            import torch.distributed as dist
            dist.init_process_group("nccl" if device_kind == "cuda" else "gloo")
            self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def mean(self, value: float) -> float:
        """The average of `value` over the processes (a collective: every rank calls it at the same step)."""
        if not self.on:
            return value
        import torch.distributed as dist
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.item() / self.world

    def close(self):
        if self.on:
            import torch.distributed as dist
            dist.barrier()
            dist.destroy_process_group()


def shard(model, compute_dtype, device):
    """FSDP2 as torchtitan applies it: fully_shard each decoder layer, then the root (embeddings, final norm and the
    tied LM head). Parameters stay fp32 masters; the all-gather and the compute are in compute_dtype, the gradient
    reduction in fp32. CODA's model then runs its layers one by one, each inside its own gather (coda.models.llama).
    The mesh is on `device`'s kind: fully_shard's default takes the machine's accelerator, which would move a
    `--device cpu` run's parameters to the GPU under its gloo process group."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mp = MixedPrecisionPolicy(param_dtype=None if compute_dtype == torch.float32 else compute_dtype,
                              reduce_dtype=torch.float32)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def full_state_dict(model, rank):
    """The model's state_dict (HF names and layouts) as whole CPU tensors on rank 0 ({} elsewhere). FSDP2's sharded
    DTensors are gathered one at a time (a collective: every rank calls this), so no rank holds two whole weights on
    the GPU at once."""
    out = {}
    for k, v in model.state_dict().items():
        if hasattr(v, "full_tensor"):
            v = v.to(v.device_mesh.device_type).full_tensor()
        if rank == 0:
            out[k] = v.detach().cpu()
    return out


def batches(ids, batch, seq, seed, device):
    g = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, ids.numel() - seq - 1, (batch,), generator=g)
        yield torch.stack([ids[s:s + seq] for s in starts]).to(device, non_blocking=True)


def forward(fwd, kind, x, device, dtype, hf=False):
    """The training loss of one batch: CODA's model computes in `dtype` (its kernels' dtype); the PyTorch baseline
    and an HF model patched for CODA (hf: --model qwen3) run under torch.autocast to it."""
    hf = hf or kind == "torch"
    with torch.autocast(device.type, dtype, enabled=hf and dtype != torch.float32):
        return fwd(input_ids=x, labels=x) if hf else fwd(x, labels=x, compute_dtype=dtype)


@torch.no_grad()
def evaluate(fwd, kind, val_ids, batch, seq, n_batches, device, dtype, rank, hf=False):
    """Mean loss over n_batches fixed validation batches of this process (rank r draws its own fixed stream, so the
    processes together see n_batches x world batches; rank 0's are those of a single-process run)."""
    loss = 0.0
    it = batches(val_ids, batch, seq, 1234 + rank, device)
    for _ in range(n_batches):
        x = next(it)
        loss += forward(fwd, kind, x, device, dtype, hf).loss.float().item()
    return loss / n_batches


def lr_at(step, steps, base, warmup):
    if step < warmup:
        return base * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def run(args, kind, ids_train, ids_val, vocab, out: Path, env: Dist):
    device, rank, cuda = env.device, env.rank, env.device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    model, fwd, cfg = make_model(kind, args.config, vocab, args.seed, device, False, args.model)
    hf = args.model != "llama"  # an HF model (patched for CODA): called as HF's, under autocast
    if env.on:
        shard(model, dtype, device)
    fwd = torch.compile(model) if args.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=cuda)
    # Each process its own batches; rank 0 draws those of a single-process run.
    data = batches(ids_train, args.batch_size, args.seq_len, args.seed + 1000 * rank, device)
    name = kind + ("+compile" if args.compile else "")
    log = open(out / f"losses_{name}.jsonl", "w") if rank == 0 else None
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    try:
        from tqdm import tqdm
        bar = tqdm(range(args.steps), desc=name, disable=args.no_progress or rank != 0, dynamic_ncols=True)
    except ImportError:
        bar = range(args.steps)
    tokens = args.batch_size * args.seq_len * env.world
    timed_tokens, timed_s, val = 0, 0.0, float("nan")
    t_last = None
    for step in bar:
        x = next(data)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        out_ = forward(fwd, kind, x, device, dtype, hf)
        out_.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        rec = {"step": step, "loss": None}
        if step % args.log_every == 0 or step == args.steps - 1:
            if cuda:
                torch.cuda.synchronize()
            now = time.perf_counter()
            if t_last is not None and step > args.warmup_timing:
                timed_s += now - t_last[0]
                timed_tokens += (step - t_last[1]) * tokens
            t_last = (now, step)
            rec["loss"] = env.mean(out_.loss.float().item())
            if step % args.eval_every == 0 or step == args.steps - 1:
                val = env.mean(evaluate(fwd, kind, ids_val, args.batch_size, args.seq_len, args.eval_batches, device,
                                        dtype, rank, hf))
                rec["val_loss"] = val
                t_last = (time.perf_counter(), step)  # evaluation is not training time
            tps = timed_tokens / timed_s if timed_s else float("nan")
            mem = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
            rec.update(tokens_per_s=tps, peak_mem_gib=mem)
            if log is not None:
                log.write(json.dumps(rec) + "\n")
                log.flush()
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(loss=f"{rec['loss']:.3f}", val=f"{val:.3f}", tok_s=f"{tps:,.0f}",
                                **({"mem": f"{mem:.1f}G"} if cuda else {}))
    if log is not None:
        log.close()
    summary = dict(model=name, family=args.model, config=args.config, steps=args.steps, tokens_per_step=tokens,
                   processes=env.world,
                   final_train_loss=rec["loss"], final_val_loss=val,
                   tokens_per_s=timed_tokens / timed_s if timed_s else None,
                   peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
                   params=sum(p.numel() for p in model.parameters()))
    if args.save and kind == "coda":
        state = full_state_dict(model, rank)
        if rank == 0:
            save_checkpoint(state, cfg, out / "checkpoint")
    del model, fwd, opt
    if cuda:
        torch.cuda.empty_cache()
    return summary


def save_checkpoint(state, cfg, path: Path):
    """HF layout: transformers' save_pretrained of an HF LlamaForCausalLM holding the same weights, or the state
    dict (already in HF names and layouts: CODA's model's state_dict, whole CPU tensors) with torch.save when
    transformers is missing. cfg: CODA's LlamaConfig, or a transformers config (--model qwen3)."""
    path.mkdir(parents=True, exist_ok=True)
    if hasattr(cfg, "to_json_string"):  # a transformers config: the HF model class of its architecture
        import transformers
        hf = transformers.AutoModelForCausalLM.from_config(cfg)
        hf.load_state_dict(state, strict=True)
        hf.save_pretrained(path)
        return
    try:
        import transformers
    except ImportError:
        torch.save(state, path / "pytorch_model.bin")
        (path / "coda_config.json").write_text(json.dumps(vars(cfg), indent=1))
        return
    hf_cfg = transformers.LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                                      intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
                                      num_attention_heads=cfg.num_attention_heads,
                                      num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                                      rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
                                      tie_word_embeddings=cfg.tie_word_embeddings)
    hf = transformers.LlamaForCausalLM(hf_cfg)
    hf.load_state_dict(state, strict=True)
    hf.save_pretrained(path)


def plot(out: Path, names):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("coda.train: matplotlib missing: no plot written (pip install matplotlib)", file=sys.stderr)
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    for name in names:
        recs = [json.loads(line) for line in open(out / f"losses_{name}.jsonl")]
        ax.plot([r["step"] for r in recs if r["loss"] is not None], [r["loss"] for r in recs if r["loss"] is not None],
                label=f"{name} train", alpha=0.7)
        v = [r for r in recs if "val_loss" in r]
        ax.plot([r["step"] for r in v], [r["val_loss"] for r in v], "o-", label=f"{name} validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("CODA vs PyTorch, same seed and data order")
    ax.legend()
    ax.grid(alpha=0.3)
    path = out / "loss.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def parser():
    p = argparse.ArgumentParser(
        prog="python -m coda.train", description=__doc__.split("\n\n")[0],
        epilog="Examples:\n" + __doc__.split("\n\n")[1] + "\n\nOutput folder (--out): losses_<model>.jsonl, summary.json, "
        "summary.md, loss.png, tokenizer.json (bpe) and checkpoint/ (config.json + model.safetensors, loadable with "
        "transformers.AutoModelForCausalLM.from_pretrained: a LlamaForCausalLM, or a Qwen3ForCausalLM with --model "
        "qwen3).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=None, metavar="FILE",
                   help="UTF-8 text file to train on (default: $CODA_DATA, else tinyshakespeare.txt from "
                        "../shared/data beside the checkout or from .data/); the last 10%% is the validation split")
    p.add_argument("--tokenizer", choices=["bpe", "byte"], default="byte",
                   help="byte: the UTF-8 bytes, vocabulary 256 (1.1M tokens of tinyshakespeare, so 2000 steps stay "
                        "under the point where the small model memorises the corpus); bpe: a byte-level BPE trained "
                        "on the corpus (default: %(default)s)")
    p.add_argument("--vocab-size", type=int, default=4096, metavar="N",
                   help="BPE vocabulary size (with --tokenizer bpe; default: %(default)s)")
    p.add_argument("--model", choices=["llama", "qwen3"], default="llama",
                   help="architecture: llama (CODA's model; baseline HF LlamaForCausalLM) or qwen3 (HF's "
                        "Qwen3ForCausalLM, patched with coda.patch_qwen3; baseline the same model unpatched; needs "
                        "transformers) (default: %(default)s)")
    p.add_argument("--config", choices=sorted(CONFIGS), default="small",
                   help="model shape: " + "; ".join(
                       f"{k}: d {v['hidden_size']}, {v['num_hidden_layers']} layers, {v['num_attention_heads']} "
                       f"heads ({v['num_key_value_heads']} kv) of {v['head_dim']}, MLP {v['intermediate_size']}"
                       for k, v in sorted(CONFIGS.items())) + " (llama3-1b uses the 128256-token vocabulary; "
                   "default: %(default)s)")
    p.add_argument("--steps", type=int, default=2000, metavar="N", help="optimizer steps (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=16, metavar="N",
                   help="sequences per step and process (under torchrun the global batch is N x processes; "
                        "default: %(default)s)")
    p.add_argument("--seq-len", type=int, default=256, metavar="N", help="tokens per sequence (default: %(default)s)")
    p.add_argument("--lr", type=float, default=1e-3,
                   help="peak AdamW learning rate, after linear warmup, then cosine decay to 10%% (default: "
                        "%(default)s)")
    p.add_argument("--warmup", type=int, default=100, metavar="N",
                   help="learning-rate warmup steps (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the initial weights and of the batch order (default: %(default)s)")
    p.add_argument("--baseline", choices=["coda", "torch"], default="coda",
                   help="which implementation to train: coda (CODA's kernels) or torch (HF transformers' "
                        "LlamaForCausalLM, or Qwen3ForCausalLM with --model qwen3, under torch.autocast, from the "
                        "same initial weights; default: %(default)s)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (default: off)")
    p.add_argument("--compare", action="store_true",
                   help="train CODA, then the torch baseline, and plot both loss curves (default: off)")
    p.add_argument("--eval-every", type=int, default=200, metavar="N",
                   help="validation loss every N steps and at the last step (default: %(default)s)")
    p.add_argument("--eval-batches", type=int, default=8, metavar="N",
                   help="fixed validation batches per evaluation and process (default: %(default)s)")
    p.add_argument("--log-every", type=int, default=10, metavar="N",
                   help="train loss, tokens/s and memory logged every N steps (default: %(default)s)")
    p.add_argument("--warmup-timing", type=int, default=20, metavar="N",
                   help="first steps excluded from tokens/s (default: %(default)s)")
    p.add_argument("--out", type=Path, default=Path("runs/train"), metavar="DIR",
                   help="output folder (default: %(default)s)")
    p.add_argument("--no-save", dest="save", action="store_false",
                   help="write no checkpoint (default: CODA's model is saved to DIR/checkpoint)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (default: shown, on rank 0)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cuda: CODA's kernels, bf16 (needs an sm_90 GPU); cpu: CODA's float64 reference path in "
                        "fp32, for tests and debugging with --config tiny (slow; gloo under torchrun; default: "
                        "%(default)s)")
    return p


def main(argv=None):
    args = parser().parse_args(argv)

    if args.device == "cuda":
        if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
            what = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA GPU"
            raise SystemExit(f"coda.train needs an NVIDIA Hopper GPU (sm_90: H100/H200) for CODA's kernels (the "
                             f"--baseline torch run too: it is the same bf16 CUDA training, for comparison); found "
                             f"{what}. (--device cpu runs the slow reference path.)")
        from . import _C
        if not _C.device_supported():
            raise SystemExit("coda.train: libcoda cannot run here: " + (_C._load_error or "device not supported"))
    env = Dist(args.device)
    lead = env.rank == 0
    data = args.data or default_data()
    text = data.read_text(encoding="utf-8")
    if lead:
        args.out.mkdir(parents=True, exist_ok=True)
    ids, vocab, _ = tokenize(text, args.tokenizer, args.vocab_size, args.out, save=lead)
    if args.config == "llama3-1b":
        vocab = 128256  # the real vocabulary size for throughput (the extra rows are never targets)
    split = int(0.9 * ids.numel())
    train_ids, val_ids = ids[:split], ids[split:]
    if val_ids.numel() <= args.seq_len + 1:
        raise SystemExit(f"coda.train: the corpus is too small for --seq-len {args.seq_len}")
    if lead:
        print(f"coda.train: {data.name}: {ids.numel():,} tokens (vocab {vocab}), {train_ids.numel():,} train / "
              f"{val_ids.numel():,} validation; {args.model} config {args.config}, {args.steps} steps x "
              f"{args.batch_size * args.seq_len * env.world:,} tokens"
              + (f" ({env.world} processes, FSDP2)" if env.on else ""))
    kinds = ["coda", "torch"] if args.compare else [args.baseline]
    summaries = [run(args, k, train_ids, val_ids, vocab, args.out, env) for k in kinds]
    env.close()
    if not lead:
        return
    (args.out / "summary.json").write_text(json.dumps(summaries, indent=1))
    lines = ["| model | final train loss | final val loss | tokens/s | peak memory GiB |", "|---|---:|---:|---:|---:|"]
    for s in summaries:
        tps = f"{s['tokens_per_s']:,.0f}" if s["tokens_per_s"] else "-"
        lines.append(f"| {s['model']} | {s['final_train_loss']:.4f} | {s['final_val_loss']:.4f} | {tps} | "
                     f"{s['peak_mem_gib']:.2f} |")
    if len(summaries) == 2:
        a, b = summaries
        lines.append("")
        ratio = f"{a['tokens_per_s'] / b['tokens_per_s']:.3f}x" if a["tokens_per_s"] and b["tokens_per_s"] else "-"
        lines.append(f"validation loss difference: {100 * (a['final_val_loss'] / b['final_val_loss'] - 1):+.2f} %; "
                     f"throughput ratio {a['model']}/{b['model']}: {ratio}")
    table = "\n".join(lines)
    (args.out / "summary.md").write_text(table + "\n")
    png = plot(args.out, [s["model"] for s in summaries])
    print(table)
    if png:
        print(f"plot: {png}")


if __name__ == "__main__":
    main()
