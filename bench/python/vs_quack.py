"""CODA against quack (Dao-AILab's CuTeDSL kernels, quack-kernels 0.6.5) and cuBLAS, op by op, in one run (issue 23,
first step): every contender of an (op, model config, tokens) is timed in the same process, taking turns.

    # on the GPU machine, once `source .whl/quack-b/quack-env` has put quack on PYTHONPATH (../shared/tools/stage-quack)
    python bench/python/vs_quack.py --out $OUT/vs_quack                        # 1B/8B/70B at 8192 tokens
    python bench/python/vs_quack.py --out $OUT/vs_quack16k --tokens 16384      # the other half of the issue's set
    python bench/python/vs_quack.py --estimate [--tokens 8192,16384]          # the planned GPU time only (no GPU)
    python bench/python/vs_quack.py --ops gemm_gu,linear_rowscale_swiglu --coda-pins "CODA_PDL=1;pp_128x192x64_c2x1"
                                        # CODA variants (CODA_PDL needs libcoda built with -DCODA_GDC=ON, docs/GEMM.md)
    python bench/python/vs_quack.py --ops linear_rowscale_qk_norm_rope --configs qwen3-1.7B,qwen3-4B,llama3-8B,qwen3-14B
                                        # the QK-norm op on Qwen3's shapes (llama3-8B's heads are Qwen3-8B's)
    python bench/python/vs_quack.py --ops rmsnorm --graph-ops rmsnorm         # + CUDA-graph replays (no host time)

Ops, their GEMM (D[M,N] = A[M,K] B, M = tokens; d, F from bench/python/common.py CONFIGS, V = 128256) and the
contenders (`impl`; CODA's first, then quack's):

- gemm_gu (M x 2F x d), gemm_down (M x d x F): coda_gemm (CODA's autotuned plain GEMM) | quack gemm_interface.gemm.
- linear_residual_rmsnorm (M x d x F, after the down projection; x = a w^T + residual, h = x gamma, rstd) | quack
  gemm_add (x only: CODA writes h and rstd besides); quack_rms: gemm_rms(C = residual, norm_weight = gamma,
  premult_out), which writes x, h and rstd as CODA's op does.
- linear_rowscale_swiglu (M x 2F x d; z = diag(rstd) h w^T, y = silu(z even) z odd) | quack
  gemm_act(activation="swiglu", store_preact=True) on the normalised input diag(rstd) h; quack_norm_act:
  gemm_norm_act(rstd, "swiglu") on h, CODA's op's own inputs.
- linear_rowscale_qk_norm_rope (M x (hq + 2 hkv) hd x d, Qwen3's q/k/v with per-head q/k RMSNorm and RoPE) | quack
  qk_rope_epi on the normalised input (compared on q and k); coda_no_z: z not stored; coda_rowscale: CODA's
  linear_rowscale on the same shape (and coda_rowscale:PIN at each --coda-pins config).
- linear_rowscale_rope (M x (hq + 2 hkv) hd x d, LLaMA's q/k/v with RoPE) | no quack op (its qk_rope_epi also norms
  every head); coda_rowscale (and coda_rowscale:PIN) as for the QK-norm op.
- linear_swiglu_bwd_zdz (M x F x d; dz, y, zdz) | quack gemm_dact(activation="swiglu") (dz, y; no zdz).
- linear_residual_rmsnorm_bwd (M x d x 2F, the gate/up dgrad; dx, a, dgamma) | quack gemm(dz, w) then
  rmsnorm.rmsnorm_bwd(dresidual_out = dx_in) (dx, dgamma; no a).
- lm_head (M x V x d, forward + backward): linear_cross_entropy (final RMSNorm + LM head + CE, one chunked pass)
  (chunks of 2048, the default; coda:chunk4096 with chunk_rows=4096) | quack rmsnorm.rmsnorm +
  linear_cross_entropy.chunked_linear_cross_entropy (tuned=False, chunks of 4096, 2048 where d = 4096); torch_compile:
  the eager head (HF RMSNorm, logits, fp32 cross-entropy) under torch.compile; cublas_gemm: the three GEMMs of the
  shape (logits, dx, dW). The rows carry peak_mib (one call's peak allocation above what was allocated before it)
  and CODA's `gemm_choice` (the kernel of its last dW GEMM).
- rmsnorm (M x d, no GEMM): rmsnorm_prepare (h = x gamma, rstd) | quack rmsnorm.rmsnorm_fwd(store_rstd=True)
  (x_hat gamma, rstd).
- block (rows with suite "block"; M x d x F names the shape): bench_block.py's block (o-projection to the next
  layer's q/k/v, attention excluded), forward + backward: coda (coda.ops.block) | torch_compile and liger (the
  PyTorch block compiled / with Liger's RMSNorm, SwiGLU, RoPE) | gemm_only (its 12 GEMMs alone through torch.mm).
  No output check (the tests check the block); torch.compile's first call compiles (tens of seconds).
Every GEMM op also times `cublas_gemm`, torch.mm of the op's GEMM alone (the speed-of-light bar).

Both layouts agree with CODA's: quack's gated activations pair accumulator columns (2i, 2i+1) as (gate, up), which
is CODA's interleaved W_gu, and quack's B operand is (K, N), so w [N, K] goes in as the view w.t().

quack's GEMMs run two ways: `quack_default` (tuned=False: the per-arch default config, sm90 pingpong 128x192 with a
2x1 cluster; quack's own tuned=True autotunes over its few dozen sm90 configs at the first call, compiling each) and
`quack_best`: the fastest of the short list --quack-configs (default: pingpong 128x192 / 192x128 / 128x128 with
clusters 2x1 and 1x2, cooperative 256x128 2x1), picked by a short screen (a `quack_screen` row per config) just
before the timing. When the pick is the default config, quack_default and quack_best time the same kernel: their
difference is the run's noise floor. quack_rms, quack_norm_act and the `quack` contenders of
linear_residual_rmsnorm_bwd, lm_head and rmsnorm run the default config.

Method (../shared/design/PROTOCOL.md, "Speed"): for each (op, config, tokens), every contender is called once (its
compile / autotune; `first_call_s`), its outputs are compared with CODA's (cuBLAS's for the plain GEMMs) on the same
inputs, max |a - b| / max |b| per output against --tol (`agrees`, `max_rel_err`: so that the rows compare the same
computation), then each is warmed with >= 2 s of back-to-back calls, then --rounds rounds in which every contender
times back-to-back calls for ~--timing-ms between CUDA events, the order rotated by one per round
(common.interleaved), while a pynvml thread samples the SM clock and board power (common.NvmlSampler). Medians
over rounds. Inputs are random normal of the scale sweep_ops.py uses, no L2 flush (weights stay hot as in a step).

Output: one JSON line per contender (suite, op, config, tokens, M, N, K, pass, impl, quack_config, ms, tflops or
gb_s, clock_mhz, watts, agrees, max_rel_err, error, commit, gpu, date, ...) in --out/vs_quack.jsonl, appended as
each op finishes (a killed run keeps what it measured), and --out/README.md with the table printed last. quack
failures (import, a rejected config, a TypeError) become rows with an `error` field; the run goes on. Ratios are
time / time: below 1, the first named is faster.

GPU time (estimates, from before the block suite was added): --estimate prints the plan: the default (8 ops x 3
configs x 8192 tokens, 30 contenders per config, 7 configs screened for 5 ops) comes to ~5.2 minutes of warm-up and
timing, plus quack's first-call compiles (by count some 40-50 kernel variants: 8 configs for each screened op, plus
the other quack calls; each compiled once per process and cached on disk under /tmp/$USER/quack_cache; first_call_s
in every row). Both token counts come to ~10.5 minutes by --estimate, more than one 10-minute device call, so the
16384-token half is a second call of the same size (--tokens 16384; the README then covers both, read back from the
folder's JSON lines, or `--report` rebuilds it). --deadline-min stops starting new (op, config, tokens) units in
time to write the README (the rest get `skipped` rows). rmsnorm's calls should take tens of microseconds (estimated
from the bytes they move), so its back-to-back timing can be bound by the host's per-call Python overhead rather
than the kernel (first_call_s and warm_ms_per_call show the scale).

quack 0.6.5 with nvidia-cutlass-dsl 4.8.1 rejects two DSL internals in its kernel-cache key with a TypeError "...
has no fail-closed semantic key" (../shared/tools/quack-env); patch_quack_cache_key() gives such values a constant
key before quack is used, and does nothing where that module does not exist.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import math
import re
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from common import (CONFIGS, EPS, QK_EPS, NvmlSampler, append_jsonl, env_var, hf_rms_norm, interleaved, is_cuda,
                    last_gemm_choice, peak_extra_gib, timed_pipelined, warm_for)
from report import commit as git_commit

SUITE = "vs_quack"
MODEL_CONFIGS = ("llama3-1B", "llama3-8B", "llama3-70B")  # names as the issue writes them; CONFIGS keys lower-case
OTHER_CONFIGS = ("qwen3-1.7B", "qwen3-4B", "qwen3-14B")  # --configs may name them (the QK-norm op's own shapes)
VOCAB = 128256
OPS = ("gemm_gu", "gemm_down", "linear_residual_rmsnorm", "linear_rowscale_swiglu", "linear_rowscale_qk_norm_rope",
       "linear_rowscale_rope", "linear_swiglu_bwd_zdz", "linear_residual_rmsnorm_bwd", "lm_head", "rmsnorm", "block")
SCREENED_OPS = ("gemm_gu", "gemm_down", "linear_residual_rmsnorm", "linear_rowscale_swiglu",
                "linear_rowscale_qk_norm_rope", "linear_swiglu_bwd_zdz")  # quack GEMMs with a config to pick
PASS = {"linear_swiglu_bwd_zdz": "bwd", "linear_residual_rmsnorm_bwd": "bwd", "lm_head": "fwdbwd", "block": "fwdbwd"}
# The block (bench_block.py's: o-projection to the next layer's q/k/v, attention excluded), forward + backward: CODA,
# torch.compile and Liger of the same PyTorch block, and its 12 GEMMs alone (4 forward, 4 dgrad, 4 wgrad on cuBLAS
# through torch.mm), the floor the issue measures the block against. Rows have suite "block".
BLOCK_IMPLS = ("gemm_only", "coda", "torch_compile", "liger")
GEMMS_PER_CALL = {"lm_head": 3, "rmsnorm": 0}
QUACK_LCE_CHUNK = 4096  # quack 0.6.5's chunked_linear_cross_entropy default chunk_size
MEMORY_OPS = ("lm_head", "block")  # ops whose rows carry peak_mib (the issue asks the LM head at no more memory)
QUACK_CONFIGS = ("pp_128x192_c2x1", "pp_128x192_c1x2", "pp_192x128_c2x1", "pp_192x128_c1x2", "pp_128x128_c2x1",
                 "pp_128x128_c1x2", "coop_256x128_c2x1")
QUACK_DEFAULT = "pp_128x192_c2x1"  # quack 0.6.5's sm90 default_config
REQUIRED_FIELDS = ("suite", "op", "config", "tokens", "impl", "ms", "clock_mhz", "watts", "commit")
DEVICE = "cuda"  # the CPU tests run main() with stand-ins on "cpu"


@dataclass(frozen=True)
class Timing:
    """Seconds of warm-up per contender, rounds, the length of one timing, the screen's warm-up / timing / rounds,
    the fewest calls one timing makes."""
    warm_s: float = 2.0
    rounds: int = 4
    timing_s: float = 0.15
    screen_warm_s: float = 0.25
    screen_s: float = 0.08
    screen_rounds: int = 2
    min_reps: int = 3

    @staticmethod
    def quick():
        return Timing(warm_s=0.3, rounds=2, timing_s=0.05, screen_warm_s=0.05, screen_s=0.03, screen_rounds=1)


def parse_quack_config(label):
    """'pp_128x192_c2x1' (pingpong) / 'coop_256x128_c2x1' (cooperative) -> the GemmConfig fields it names."""
    m = re.fullmatch(r"(pp|coop)_(\d+)x(\d+)_c(\d+)x(\d+)", label)
    if not m:
        raise ValueError(f"quack config {label!r}: expected pp_MxN_cAxB or coop_MxN_cAxB, e.g. pp_128x192_c2x1")
    kind, tm, tn, cm, cn = m.groups()
    return dict(tile_m=int(tm), tile_n=int(tn), pingpong=kind == "pp", cluster_m=int(cm), cluster_n=int(cn))


def contenders(op, quack=True, coda_pins=(), graph_ops=()):
    """The impl names timed for op (references first: cuBLAS, then CODA, then CODA with each --coda-pins config:
    `coda:PIN`, lm_head's coda:chunk4096 and torch_compile, quack's; for an op in --graph-ops, `coda_graph` and
    each quack call's `<impl>_graph` last). build_case builds the same set, with the `coda:PIN` entries after quack's
    (and run_case adds `quack_best_graph` once the screen has picked quack_best)."""
    if op == "block":
        return list(BLOCK_IMPLS) + [f"coda:{pin}" for pin in coda_pins]
    base = ["coda"] if op == "rmsnorm" else ["cublas_gemm", "coda"] + [f"coda:{pin}" for pin in coda_pins]
    if op == "linear_rowscale_qk_norm_rope":
        base.append("coda_no_z")  # forward only: z (the backward's input) not stored, as quack's qk_rope stores none
    if op in ("linear_rowscale_qk_norm_rope", "linear_rowscale_rope"):
        base.append("coda_rowscale")  # CODA's linear_rowscale on the same shape: the epilogue-free floor
        base += [f"coda_rowscale:{pin}" for pin in floor_pins(coda_pins)]  # the floor at each pinned tile
    if op == "lm_head":
        base += ["coda:chunk4096", "torch_compile"]
    extra = {"linear_residual_rmsnorm": ["quack_default", "quack_best", "quack_rms"],
             "linear_rowscale_swiglu": ["quack_default", "quack_best", "quack_norm_act"],
             "linear_residual_rmsnorm_bwd": ["quack"], "lm_head": ["quack"], "rmsnorm": ["quack"],
             "linear_rowscale_rope": []}
    quacks = extra.get(op, ["quack_default", "quack_best"]) if quack else []
    graphed = [f"{impl}_graph" for impl in ["coda"] + quacks] if op in graph_ops else []
    return base + quacks + graphed


def op_shape(op, cfg, M):
    """(M, N, K) of op's GEMM at model config cfg = (d, F, hq, hkv, hd); rmsnorm: (M, d, None); block: (M, d, F)."""
    d, F = cfg[0], cfg[1]
    return {"gemm_gu": (M, 2 * F, d), "gemm_down": (M, d, F), "linear_residual_rmsnorm": (M, d, F),
            "linear_rowscale_swiglu": (M, 2 * F, d), "linear_swiglu_bwd_zdz": (M, F, d),
            "linear_residual_rmsnorm_bwd": (M, d, 2 * F), "lm_head": (M, VOCAB, d), "rmsnorm": (M, d, None),
            "block": (M, d, F), "linear_rowscale_qk_norm_rope": (M, (cfg[2] + 2 * cfg[3]) * cfg[4], d),
            "linear_rowscale_rope": (M, (cfg[2] + 2 * cfg[3]) * cfg[4], d)}[op]


def block_gemms(cfg, M):
    """(M, N, K) of the block's four forward GEMMs: o-projection, gate/up, down, q/k/v."""
    d, F, hq, hkv, hd = cfg
    return [(M, d, hq * hd), (M, 2 * F, d), (M, d, F), (M, (hq + 2 * hkv) * hd, d)]


def work(op, shape, cfg=None):
    """{"flop": ...} of one call (2MNK per GEMM; the block: its 4 forward GEMMs x 3 for forward + backward, cfg
    needed), or {"bytes": ...} moved by the memory-bound rmsnorm."""
    M, N, K = shape
    if op == "rmsnorm":
        return {"bytes": 2 * M * N * 2 + M * 4 + N * 2}  # x in, h out (bf16), rstd out (fp32), gamma
    if op == "block":
        return {"flop": 3 * sum(2 * m * n * k for m, n, k in block_gemms(cfg, M))} if cfg else {}
    return {"flop": GEMMS_PER_CALL.get(op, 1) * 2 * M * N * K}


def canonical_config(name):
    """'llama3-8b' / 'LLAMA3-8B' -> 'llama3-8B'; ValueError for another name."""
    for c in MODEL_CONFIGS + OTHER_CONFIGS:
        if c.lower() == name.strip().lower():
            return c
    raise ValueError(f"unknown model config {name!r}; choose from {', '.join(MODEL_CONFIGS + OTHER_CONFIGS)}")


def estimate_seconds(ops, configs, tokens, timing, quack=True, n_screen=len(QUACK_CONFIGS), setup_s=1.5,
                     tflops=650.0, coda_pins=(), graph_ops=()):
    """GPU seconds the run should take, quack's compiles left out: per (op, config, tokens), every contender's
    warm-up and rounds (one timing lasts --timing-ms, or min_reps calls where a call is longer, a call's time
    guessed from its FLOPs at `tflops`), the screen of the config short list, and setup_s for inputs, first calls
    and the output comparison."""
    total = 0.0
    for c in configs:
        cfg = CONFIGS[c.lower()]
        for M in tokens:
            for op in ops:
                w = work(op, op_shape(op, cfg, M), cfg)
                call_s = w.get("flop", 0) / (tflops * 1e12)
                one = max(timing.timing_s, timing.min_reps * call_s)
                n = len(contenders(op, quack, coda_pins, graph_ops))
                total += setup_s + n * (max(timing.warm_s, call_s) + timing.rounds * one)
                if quack and op in SCREENED_OPS:
                    screen_one = max(timing.screen_s, timing.min_reps * call_s)
                    total += n_screen * (timing.screen_warm_s + timing.screen_rounds * screen_one)
    return total


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default=",".join(MODEL_CONFIGS), help="model configs (default: %(default)s)")
    p.add_argument("--tokens", default="8192",
                   help="token counts M, comma-separated (default: %(default)s; the issue's set adds 16384: one "
                        "device call each)")
    p.add_argument("--ops", default="all", help=f"'all' or a comma-separated subset of {', '.join(OPS)}")
    p.add_argument("--quick", action="store_true", help="a smoke run: 0.3 s warm-up, 2 rounds, short timings")
    p.add_argument("--out", type=Path, default=None, help="folder for vs_quack.jsonl and README.md")
    p.add_argument("--no-quack", dest="quack", action="store_false", help="CODA and cuBLAS only")
    p.add_argument("--quack-configs", default=",".join(QUACK_CONFIGS),
                   help="the short list quack_best is picked from (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 4, --quick 2)")
    p.add_argument("--warm-s", type=float, default=None, help="warm-up seconds per contender (default 2, --quick 0.3)")
    p.add_argument("--timing-ms", type=float, default=None, help="length of one timing (default 150, --quick 50)")
    p.add_argument("--tol", type=float, default=0.03,
                   help="max |a - b| / max |b| for `agrees` (bf16 outputs; default %(default)s)")
    p.add_argument("--coda-pins", default="",
                   help="';'-separated configs (config[:knobs]) to time CODA's op with, each pinned as a contender "
                        "`coda:PIN` (CODA_OP_CONFIG's global form, CODA_GEMM_CONFIG for gemm_gu/gemm_down): an op "
                        "that does not compile a pinned config gets an error row for it; an entry VAR=VALUE with "
                        "VAR a CODA_* variable sets that instead (e.g. CODA_PDL=1)")
    p.add_argument("--graph-ops", default="",
                   help="comma-separated ops also timed as CUDA-graph replays of 20 calls (`coda_graph`, "
                        "`quack_graph`, `quack_default_graph`, `quack_best_graph`, ..., per call): for ops whose "
                        "host time per call may exceed the kernel's, e.g. rmsnorm or quack's CuTeDSL launches")
    p.add_argument("--deadline-min", type=float, default=None,
                   help="start no new (op, config, tokens) after this many minutes (each gets a `skipped` row)")
    p.add_argument("--commit", default=None, help="commit label of the rows (default: git rev-parse --short HEAD)")
    p.add_argument("--estimate", action="store_true", help="print the planned GPU time and exit")
    p.add_argument("--report", action="store_true",
                   help="no measuring: rewrite --out/README.md from --out/vs_quack.jsonl (e.g. after appending "
                        "another call's rows to it)")
    a = p.parse_args(argv)
    try:
        a.configs = list(dict.fromkeys(canonical_config(c) for c in a.configs.split(",") if c.strip()))
    except ValueError as e:
        p.error(f"--configs: {e}")
    try:
        a.tokens = list(dict.fromkeys(int(t) for t in a.tokens.split(",") if t.strip()))
    except ValueError:
        p.error(f"--tokens {a.tokens!r}: expected integers separated by commas")
    if not a.tokens or any(t <= 0 or t % 128 for t in a.tokens):
        p.error("--tokens: each must be a positive multiple of 128")
    if a.ops.strip() == "all":
        a.ops = list(OPS)
    else:
        a.ops = list(dict.fromkeys(o.strip() for o in a.ops.split(",") if o.strip()))
        bad = [o for o in a.ops if o not in OPS]
        if bad or not a.ops:
            p.error(f"--ops: unknown {', '.join(bad) or '(none given)'}; the ops are {', '.join(OPS)}")
    a.coda_pins = list(dict.fromkeys(c.strip() for c in a.coda_pins.split(";") if c.strip()))
    a.graph_ops = list(dict.fromkeys(o.strip() for o in a.graph_ops.split(",") if o.strip()))
    if any(o not in OPS for o in a.graph_ops):
        p.error(f"--graph-ops: unknown {', '.join(o for o in a.graph_ops if o not in OPS)}; the ops are "
                f"{', '.join(OPS)}")
    a.quack_configs = list(dict.fromkeys(c.strip() for c in a.quack_configs.split(",") if c.strip()))
    for c in a.quack_configs:
        try:
            parse_quack_config(c)
        except ValueError as e:
            p.error(f"--quack-configs: {e}")
    if a.quack and not a.quack_configs:
        p.error("--quack-configs: at least one config")
    t = Timing.quick() if a.quick else Timing()
    if a.rounds is not None:
        if a.rounds < 1:
            p.error("--rounds must be >= 1")
        t = replace(t, rounds=a.rounds)
    if a.warm_s is not None:
        t = replace(t, warm_s=a.warm_s)
    if a.timing_ms is not None:
        t = replace(t, timing_s=a.timing_ms / 1e3)
    a.timing = t
    return a


# --- quack ----------------------------------------------------------------------------------------------------------

def _fail_open_key(original):
    def key(value, seen):
        try:
            return original(value, seen)
        except TypeError as e:
            if "no fail-closed semantic key" not in str(e):
                raise
            return ("coda-bench-unkeyed", type(value).__module__, type(value).__qualname__)
    key._coda_original = original
    return key


def patch_quack_cache_key(modules=None):
    """Wraps quack.gemm_runtime.identity.semantic_value_key, in that module and in every quack.* module of `modules`
    (default sys.modules) that imported it by name, so that a value it has no key for (TypeError "... has no
    fail-closed semantic key") gets a constant key of its type instead of failing the call. Returns how many
    module attributes now hold the wrapper (0 where the module is absent: nothing is imported or changed then).
    Idempotent; call it again after importing more of quack."""
    modules = sys.modules if modules is None else modules
    ident = modules.get("quack.gemm_runtime.identity")
    if ident is None and modules is sys.modules:
        try:
            ident = importlib.import_module("quack.gemm_runtime.identity")
        except Exception:  # no quack, or a version without this module
            return 0
    current = getattr(ident, "semantic_value_key", None) if ident is not None else None
    if current is None:
        return 0
    original = getattr(current, "_coda_original", current)
    wrapper = current if current is not original else _fail_open_key(original)
    count = 0
    for name, mod in list(modules.items()):
        if mod is None or not (name == "quack" or name.startswith("quack.")):
            continue
        for attr, value in list(vars(mod).items()):
            if value is original:
                setattr(mod, attr, wrapper)
            if value is original or value is wrapper:
                count += 1
    return count


class QuackOps:
    """quack 0.6.5's calls as this bench makes them. label None: the default config (tuned=False); a label from
    --quack-configs: that config pinned (GemmConfig, sm90, static persistent scheduler as quack's sm90 list)."""

    def __init__(self):
        self.patched = patch_quack_cache_key()
        import quack
        import quack.gemm_config
        import quack.gemm_interface
        import quack.linear_cross_entropy
        import quack.rmsnorm
        import quack.epilogue.library
        self.patched = patch_quack_cache_key()  # the modules imported just now
        self.qk_rope_epi = quack.epilogue.library.qk_rope_epi
        self.version = getattr(quack, "__version__", "?")
        # quack/__init__ re-exports the function rmsnorm under the module's name: take the module itself
        self.gi, self.rms, self.lce_mod = (quack.gemm_interface, sys.modules["quack.rmsnorm"],
                                           quack.linear_cross_entropy)
        self.GemmConfig = quack.gemm_config.GemmConfig

    def config(self, label):
        if label is None:
            return None
        return self.GemmConfig(**parse_quack_config(label), is_dynamic_persistent=False, device_capacity=9)

    def gemm(self, A, B, out, label=None):
        if label is None:
            return self.gi.gemm(A, B, out=out, tuned=False)
        self.gi.gemm_tuned.fn(A, B, out, config=self.config(label))  # what gemm(tuned=False) calls, config pinned
        return out

    def gemm_add(self, A, B, C, out, label=None):
        if label is None:
            return self.gi.gemm_add(A, B, C, out=out, tuned=False)
        self.gi.gemm_tuned.fn(A, B, out, C, config=self.config(label))
        return out

    def gemm_act(self, A, B, preact, postact, label=None):
        return self.gi.gemm_act(A, B, activation="swiglu", preact_out=preact, postact_out=postact,
                                store_preact=True, tuned=False, config=self.config(label))

    def gemm_dact(self, A, B, preact, dx, postact, label=None):
        return self.gi.gemm_dact(A, B, preact, activation="swiglu", dx_out=dx, postact_out=postact, tuned=False,
                                 config=self.config(label))

    def qk_rope(self, A, B, cs, head_dim, w, out, label=None):
        """quack.epilogue.library.qk_rope_epi: per-head RMSNorm (statistics in a prepass over the accumulator) times
        the rowvec w, then RoPE from the interleaved (M, head_dim) cos/sin table, on every head of D."""
        res = self.qk_rope_epi(A, B, out={"D": out}, tuned=False, config=self.config(label), cs=cs, qk=head_dim, w=w)
        return res["D"]

    def gemm_rms(self, A, B, C, gamma, out, premult, eps):
        return self.gi.gemm_rms(A, B, C=C, norm_weight=gamma, out=out, premult_out=premult, eps=eps, tuned=False)

    def gemm_norm_act(self, A, B, rstd, preact, postact):
        return self.gi.gemm_norm_act(A, B, rstd=rstd, activation="swiglu", preact_out=preact, postact_out=postact,
                                     store_preact=True, tuned=False)

    def rmsnorm_fwd(self, x, w, eps):
        out, _, rstd = self.rms.rmsnorm_fwd(x, w, eps=eps, store_rstd=True)
        return out, rstd

    def rmsnorm_bwd(self, x, w, dout, rstd, dresidual):
        dx, dw, _, _ = self.rms.rmsnorm_bwd(x, w, dout, rstd, dresidual_out=dresidual)
        return dx, dw

    def rmsnorm(self, x, w, eps):
        return self.rms.rmsnorm(x, w, eps=eps)

    def lce(self, n, w, t, chunk_size=QUACK_LCE_CHUNK):
        return self.lce_mod.chunked_linear_cross_entropy(n, w, t, chunk_size=chunk_size, tuned=False)

    def lce_path(self, n, w, chunk_size=QUACK_LCE_CHUNK):
        try:
            return "scaled_exp" if self.lce_mod.scaled_exp_lce_supported(n, w, chunk_size, "mean") else "chunked"
        except Exception as e:
            return f"? ({type(e).__name__})"


def load_quack():
    """(QuackOps, None), or (None, why not)."""
    try:
        return QuackOps(), None
    except Exception as e:  # ImportError without quack-env; anything else quack's import raises
        return None, _err(e)


# --- cases ----------------------------------------------------------------------------------------------------------

def same(*names):
    """Output pairs compared under the same name in the contender's and the reference's outputs."""
    return [(n, (lambda o, n=n: o[n]), (lambda r, n=n: r[n])) for n in names]


class Case:
    """One (op, config, tokens): `fns` impl -> call returning its outputs ({name: tensor}); `checks` impl -> (the
    reference impl, [(name, get from the outputs, get from the reference's)]); `pinned` label -> quack's call with
    that config (None where the op has no config short list; `quack_best` is made from it); `labels` impl -> the
    quack config it runs; `info` extra row fields; `choices` impl -> the kernel coda_gemm ran (its `gemm_choice`
    field, filled by the calls)."""

    def __init__(self, op, shape, fns, checks=None, pinned=None, labels=None, info=None, choices=None):
        self.op, self.shape, self.fns = op, shape, dict(fns)
        self.checks, self.pinned = dict(checks or {}), pinned
        self.labels, self.info = dict(labels or {}), dict(info or {})
        self.choices = choices if choices is not None else {}


def _rand(g, device):
    def r(*shape, std=1.0):
        return (torch.randn(*shape, device=device, generator=g) * std).to(torch.bfloat16)
    return r


def build_case(op, cfg, M, quack, quack_configs=QUACK_CONFIGS, device="cuda", coda_pins=(), graph_ops=()):
    """The contenders of op at model config cfg and M tokens on CUDA (quack: QuackOps or None; quack_configs: the
    short list quack_best is screened from; coda_pins: CODA's own call with each config pinned, `coda:PIN`;
    graph_ops: ops whose CODA and quack calls are also timed as CUDA-graph replays, `coda_graph`, `quack_graph`,
    `quack_default_graph`, ...)."""
    from coda import _C, _kernels
    shape = op_shape(op, cfg, M)
    _, N, K = shape
    d = cfg[0]
    g = torch.Generator(device=device).manual_seed(0)
    r = _rand(g, device)
    bf = dict(device=device, dtype=torch.bfloat16)
    fns, checks, pinned, labels, info = {}, {}, None, {}, {}
    q = quack

    def quack_pair(make, names, ref="coda"):
        """quack_default, quack_best (set later from the screen) and the pinned calls, from make(label)."""
        nonlocal pinned
        fns["quack_default"] = make(None)
        labels["quack_default"] = "default"
        pinned = {}
        for lbl in quack_configs:
            pinned[lbl] = make(lbl)
        checks["quack_default"] = checks["quack_best"] = (ref, same(*names))

    if op in ("gemm_gu", "gemm_down"):
        a, w = r(M, K), r(N, K, std=K ** -0.5)
        y_cb, y_q = torch.empty(M, N, **bf), torch.empty(M, N, **bf)
        fns["cublas_gemm"] = lambda: {"y": torch.mm(a, w.t(), out=y_cb)}
        from bench_gemm import coda_gemm_call
        y_coda = torch.empty(M, N, **bf)
        call = coda_gemm_call(a, w, y_coda, torch.device(device), _C.stream(torch.device(device)))
        fns["coda"] = lambda: (call(), {"y": y_coda})[1]
        checks["coda"] = ("cublas_gemm", same("y"))
        if q:
            quack_pair(lambda lbl: (lambda: {"y": q.gemm(a, w.t(), y_q, lbl)}), ["y"], ref="cublas_gemm")
    elif op == "linear_residual_rmsnorm":
        a, w, residual = r(M, K), r(d, K, std=K ** -0.5), r(M, d, std=4.0)
        gamma = 1 + r(d, std=0.1)
        buf = torch.empty(M, d, **bf)
        fns["cublas_gemm"] = lambda: {"y": torch.mm(a, w.t(), out=buf)}
        fns["coda"] = lambda: dict(zip(("x", "h", "rstd"), _kernels.linear_residual_rmsnorm(a, w, residual, gamma,
                                                                                             EPS)))
        if q:
            x_q = torch.empty(M, d, **bf)
            quack_pair(lambda lbl: (lambda: {"x": q.gemm_add(a, w.t(), residual, x_q, lbl)}), ["x"])
            h_r, x_r = torch.empty(M, d, **bf), torch.empty(M, d, **bf)

            def rms():
                h, rstd = q.gemm_rms(a, w.t(), residual, gamma, h_r, x_r, EPS)
                return {"x": x_r, "h": h, "rstd": rstd}
            fns["quack_rms"] = rms
            labels["quack_rms"] = "default"
            checks["quack_rms"] = ("coda", same("x", "h", "rstd"))
    elif op == "linear_rowscale_swiglu":
        h, w = r(M, d, std=4.0), r(2 * cfg[1], d, std=d ** -0.5)
        rstd = torch.rand(M, device=device, generator=g) + 0.5
        n = (h.float() * rstd[:, None]).to(torch.bfloat16)  # quack's gemm_act takes the normalised input
        z_cb = torch.empty(M, N, **bf)
        fns["cublas_gemm"] = lambda: {"z": torch.mm(h, w.t(), out=z_cb)}
        fns["coda"] = lambda: dict(zip(("z", "y"), _kernels.linear_rowscale_swiglu(h, w, rstd)))
        if q:
            z_q, y_q = torch.empty(M, N, **bf), torch.empty(M, N // 2, **bf)
            quack_pair(lambda lbl: (lambda: dict(zip(("z", "y"), q.gemm_act(n, w.t(), z_q, y_q, lbl)))), ["z", "y"])
            z_n, y_n = torch.empty(M, N, **bf), torch.empty(M, N // 2, **bf)
            fns["quack_norm_act"] = lambda: dict(zip(("z", "y"), q.gemm_norm_act(h, w.t(), rstd, z_n, y_n)))
            labels["quack_norm_act"] = "default"
            checks["quack_norm_act"] = ("coda", same("z", "y"))
    elif op in ("linear_rowscale_qk_norm_rope", "linear_rowscale_rope"):
        # The q/k/v projection with RoPE (LLaMA), with per-head q/k RMSNorm too (Qwen3; llama3-8B's heads are
        # Qwen3-8B's). quack's nearest to the QK-norm op: qk_rope_epi, which norms and rotates every head (v too) from
        # a cos/sin table and takes the normalised input: compared on q and k. quack has no RoPE-only op.
        hq, hkv, hd = cfg[2], cfg[3], cfg[4]
        rot = (hq + hkv) * hd
        qk_norm = op == "linear_rowscale_qk_norm_rope"
        h, w = r(M, d, std=4.0), r(N, d, std=d ** -0.5)
        rstd = torch.rand(M, device=device, generator=g) + 0.5
        if qk_norm:
            q_gamma, k_gamma = (1 + r(hd, std=0.1)).float(), (1 + r(hd, std=0.1)).float()
        pos = torch.randint(0, 131072, (M,), device=device, generator=g, dtype=torch.int32)
        inv = (1.0 / 500000.0 ** (torch.arange(0, hd, 2, device=device, dtype=torch.float64) / hd)).float()
        z_cb = torch.empty(M, N, **bf)
        fns["cublas_gemm"] = lambda: {"z": torch.mm(h, w.t(), out=z_cb)}
        if not qk_norm:
            fns["coda"] = lambda: {"qkv": _kernels.linear_rowscale_rope(h, w, rstd, pos, inv, hq, hkv, hd)}
            # v passes through RoPE: the row-scaled GEMM's v columns are CODA's op's
            checks["coda_rowscale"] = ("coda", [("v", lambda o: o["z"][:, rot:], lambda r_: r_["qkv"][:, rot:])])
        else:
            def coda_call():
                qkv, z = _kernels.linear_rowscale_qk_norm_rope(h, w, rstd, q_gamma, k_gamma, pos, inv, hq, hkv, hd,
                                                               QK_EPS)
                return {"qk": qkv[:, :rot], "z": z}
            fns["coda"] = coda_call

            def coda_no_z():
                qkv, _ = _kernels.linear_rowscale_qk_norm_rope(h, w, rstd, q_gamma, k_gamma, pos, inv, hq, hkv, hd,
                                                               QK_EPS, store_z=False)
                return {"qk": qkv[:, :rot]}
            fns["coda_no_z"] = coda_no_z
            checks["coda_no_z"] = ("coda", same("qk"))
            checks["coda_rowscale"] = ("coda", same("z"))
        fns["coda_rowscale"] = lambda: {"z": _kernels.linear_rowscale(h, w, rstd)}  # after its reference, "coda"
        if q and qk_norm:
            n = (h.float() * rstd[:, None]).to(torch.bfloat16)
            theta = pos.double()[:, None] * inv.double()[None, :]
            cs = torch.stack((torch.cos(theta), torch.sin(theta)), dim=-1).reshape(M, hd).to(torch.bfloat16)
            w_row = torch.cat((q_gamma.repeat(hq), k_gamma.repeat(hkv), torch.ones(hkv * hd, device=device)))
            w_row = w_row.to(torch.bfloat16)
            d_q = torch.empty(M, N, **bf)
            quack_pair(lambda lbl: (lambda: {"qk": q.qk_rope(n, w.t(), cs, hd, w_row, d_q, lbl)[:, :rot]}), ["qk"])
    elif op == "linear_swiglu_bwd_zdz":
        dx, w_down, z = r(M, d), r(d, N, std=d ** -0.5), r(M, 2 * N)
        dy_cb = torch.empty(M, N, **bf)
        fns["cublas_gemm"] = lambda: {"dy": torch.mm(dx, w_down, out=dy_cb)}
        fns["coda"] = lambda: dict(zip(("dz", "y", "zdz"), _kernels.linear_swiglu_bwd_zdz(dx, w_down, z)))
        if q:
            dz_q, y_q = torch.empty(M, 2 * N, **bf), torch.empty(M, N, **bf)
            quack_pair(lambda lbl: (lambda: dict(zip(("dz", "y"), q.gemm_dact(dx, w_down, z, dz_q, y_q, lbl)))),
                       ["dz", "y"])
    elif op == "linear_residual_rmsnorm_bwd":
        dz, w = r(M, K), r(K, d, std=K ** -0.5)
        x, dx_in, gamma = r(M, d, std=4.0), r(M, d), 1 + r(d, std=0.1)
        rstd = torch.rsqrt(x.float().pow(2).mean(-1) + EPS)
        # zdz = (1/d) sum_j D gamma c, c = x rstd: the value that the LM head's cross-entropy step or rope_bwd_zdz
        # hands linear_residual_rmsnorm_bwd in a step
        D = torch.mm(dz, w)
        zdz = (D.float() * gamma.float() * x.float() * rstd[:, None]).sum(-1) / d
        del D
        buf = torch.empty(M, d, **bf)
        fns["cublas_gemm"] = lambda: {"D": torch.mm(dz, w, out=buf)}
        fns["coda"] = lambda: dict(zip(("dx", "a", "dgamma"), _kernels.linear_residual_rmsnorm_bwd(
            dz, w, x, gamma, rstd, zdz, dx_in, 1.0)))
        if q:
            D_q = torch.empty(M, d, **bf)

            def compose():
                dxq, dwq = q.rmsnorm_bwd(x, gamma, q.gemm(dz, w, D_q), rstd, dx_in)
                return {"dx": dxq, "dgamma": dwq}
            fns["quack"] = compose
            labels["quack"] = "default"
            checks["quack"] = ("coda", same("dx", "dgamma"))
    elif op == "lm_head":
        V = N
        x = (torch.randn(M, d, device=device, generator=g) * 3).bfloat16().requires_grad_()
        gam = (1 + 0.1 * torch.randn(d, device=device, generator=g)).bfloat16().requires_grad_()
        w = (0.02 * torch.randn(V, d, device=device, generator=g)).bfloat16().requires_grad_()
        t = torch.randint(0, V, (M,), device=device, generator=g)

        def step(loss_fn):
            def call():
                loss = loss_fn()
                loss.backward()
                out = {"loss": loss.detach().float(), "dx": x.grad, "dw": w.grad, "dgamma": gam.grad}
                x.grad = w.grad = gam.grad = None
                return out
            return call
        with torch.no_grad():
            n_c = hf_rms_norm(x, gam)
        logits, dxb, dwb = torch.empty(M, V, **bf), torch.empty(M, d, **bf), torch.empty(V, d, **bf)
        wd = w.detach()

        def gemms():  # the LM head's three GEMMs, the logits buffer standing in for their gradient
            torch.mm(n_c, wd.t(), out=logits)
            torch.mm(logits, wd, out=dxb)
            torch.mm(logits.t(), n_c, out=dwb)
            return {"dx": dxb}
        fns["cublas_gemm"] = gemms
        import coda
        fns["coda"] = step(lambda: coda.ops.linear_cross_entropy(x, gam, w, t, EPS))
        # quack's chunk size (4096) beside CODA's default (2048): fewer fp32 dW passes, twice the logits chunk.
        fns["coda:chunk4096"] = step(lambda: coda.ops.linear_cross_entropy(x, gam, w, t, EPS, chunk_rows=4096))
        checks["coda:chunk4096"] = ("coda", same("loss", "dx", "dw", "dgamma"))
        # torch.compile of the eager head (HF RMSNorm, logits, fp32 cross-entropy), as bench_lm_head.py times it.
        compiled = torch.compile(lambda: F.cross_entropy((hf_rms_norm(x, gam) @ w.T).float(), t), fullgraph=True)
        fns["torch_compile"] = step(compiled)
        checks["torch_compile"] = ("coda", same("loss", "dx", "dw", "dgamma"))
        if q:
            # quack 0.6.5's scaled-exp path rejects chunk == d ("operand 'v': m == n makes row/col inference
            # ambiguous", llama3-8B at its default 4096): there it runs chunks of half that.
            q_chunk = QUACK_LCE_CHUNK if d != QUACK_LCE_CHUNK else QUACK_LCE_CHUNK // 2
            fns["quack"] = step(lambda: q.lce(q.rmsnorm(x, gam, EPS), w, t, q_chunk))
            labels["quack"] = f"chunk {q_chunk}"
            info["quack_lce_path"] = q.lce_path(n_c, wd, q_chunk)
            checks["quack"] = ("coda", same("loss", "dx", "dw", "dgamma"))
    elif op == "block":
        fns.update(block_contenders(cfg, M, device))
    elif op == "rmsnorm":
        x, gamma = r(M, d, std=4.0), 1 + r(d, std=0.1)
        fns["coda"] = lambda: dict(zip(("h", "rstd"), _kernels.rmsnorm_prepare(x, gamma, EPS)))
        if q:
            fns["quack"] = lambda: dict(zip(("n", "rstd"), q.rmsnorm_fwd(x, gamma, EPS)))
            labels["quack"] = "default"
            checks["quack"] = ("coda", [("n", lambda o: o["n"], lambda r_: r_["h"].float() * r_["rstd"][:, None]),
                                        ("rstd", lambda o: o["rstd"], lambda r_: r_["rstd"])])
    else:
        raise ValueError(f"unknown op {op!r}")
    if op != "rmsnorm":
        for pin in coda_pins:
            fns[f"coda:{pin}"] = with_env(*pin_variable(op, pin), fns["coda"])
            if "coda" in checks:  # the same comparison as CODA's default call
                checks[f"coda:{pin}"] = checks["coda"]
        if "coda_rowscale" in fns:
            for pin in floor_pins(coda_pins):
                fns[f"coda_rowscale:{pin}"] = with_env(*pin_variable(op, pin), fns["coda_rowscale"])
                checks[f"coda_rowscale:{pin}"] = checks["coda_rowscale"]
    choices = {}
    # Which kernel coda_gemm ran (tuned, pinned or cached): the rows say. For lm_head: the last chunk's dW GEMM.
    if op in ("gemm_gu", "gemm_down", "lm_head"):
        for impl in [k for k in fns if k.startswith("coda")]:
            fns[impl] = recording_choice(fns[impl], choices, impl)
    if op in graph_ops:  # quack_best's replay: run_case, after the screen
        for impl in [i for i in fns if i == "coda" or (i.startswith("quack") and not i.endswith("_graph"))]:
            fns[f"{impl}_graph"] = GraphReplay(fns[impl])
            if impl in checks:
                checks[f"{impl}_graph"] = checks[impl]
    return Case(op, shape, fns, checks, pinned, labels, info, choices)


class GraphReplay:
    """fn captured `calls` times into one CUDA graph, captured at the first call (so that a capture failure is that
    contender's error row, not the case's); each call replays the graph and returns the last captured call's outputs.
    For ops whose per-call host time (Python, ctypes, dispatch) exceeds the kernel's: the replay times the kernels.
    run_case divides the measured time by `calls`."""

    def __init__(self, fn, calls=20):
        self.fn, self.calls, self.graph, self.out = fn, calls, None, None

    def __call__(self):
        if self.graph is None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up off the capture (lazy initialisation, allocator)
                self.fn()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(self.calls):
                    self.out = self.fn()
            self.graph = graph
        self.graph.replay()
        return self.out


def per_op_call(fn, result):
    """A timing result of fn per op call: a GraphReplay's ms (and warm_ms_per_call) divided by its calls."""
    calls = getattr(fn, "calls", 1)
    if calls != 1:
        result = dict(result, graph_calls=calls)
        for k in ("ms", "warm_ms_per_call"):
            if isinstance(result.get(k), (int, float)):
                result[k] = result[k] / calls
    return result


def block_contenders(cfg, M, device="cuda"):
    """{impl: call} of the block suite (BLOCK_IMPLS): each call one forward + backward of bench_block.py's block
    (fixed upstream gradients; parameter and input gradients dropped after each call, as a training step's
    zero_grad), gemm_only the block's 12 GEMMs (block_gemms, their dgrads and wgrads) into preallocated bf16 buffers.
    The calls return {} (no output check: tests/ check the block's numbers). Liger is imported at its first call, so
    without liger-kernel only its row is an error."""
    import bench_block as bb
    w, y0, x0, pos, inv, cos, sin = bb.make(cfg, M, device=device)
    inputs = [y0, x0]

    def fwd_bwd(fwd, params):
        step = bb.fwd_bwd_step(fwd, inputs, params)
        return lambda: (step(), {})[1]

    coda_fwd, coda_params = bb.coda_runner(cfg, w, pos, inv)
    compiled = torch.compile(lambda a, b: bb.torch_block(a, b, w, cos, sin, cfg), fullgraph=True)
    liger = []

    def liger_call():
        if not liger:
            lf = bb.liger_fns()
            liger.append(fwd_bwd(lambda a, b: bb.torch_block(a, b, w, cos, sin, cfg, **lf), list(w.values())))
        return liger[0]()

    g = torch.Generator(device=device).manual_seed(1)

    def r(*shape, std=1.0):
        return (torch.randn(*shape, device=device, generator=g) * std).to(torch.bfloat16)
    mats = []
    for m, n, k in block_gemms(cfg, M):
        mats.append(dict(x=r(m, k), w=r(n, k, std=k ** -0.5), dy=r(m, n, std=0.01),
                         y=torch.empty(m, n, device=device, dtype=torch.bfloat16),
                         dx=torch.empty(m, k, device=device, dtype=torch.bfloat16),
                         dw=torch.empty(n, k, device=device, dtype=torch.bfloat16)))

    def gemm_only():
        for t in mats:
            torch.mm(t["x"], t["w"].t(), out=t["y"])
        for t in reversed(mats):
            torch.mm(t["dy"], t["w"], out=t["dx"])
            torch.mm(t["dy"].t(), t["x"], out=t["dw"])
        return {}

    return {"gemm_only": gemm_only, "coda": fwd_bwd(coda_fwd, coda_params),
            "torch_compile": fwd_bwd(compiled, list(w.values())), "liger": liger_call}


def recording_choice(fn, choices, impl):
    """fn, storing the kernel coda_gemm last ran on this thread (common.last_gemm_choice) in choices[impl]; nothing
    where libcoda is not loaded (the CPU tests' stand-ins)."""
    def call():
        out = fn()
        try:
            choices[impl] = last_gemm_choice()
        except RuntimeError:
            pass
        return out
    return call


def pin_variable(op, pin):
    """(variable, value) that a --coda-pins entry sets: VAR=VALUE as given for a CODA_* variable (e.g. CODA_PDL=1),
    else the config pin in CODA_GEMM_CONFIG (gemm_gu, gemm_down) or CODA_OP_CONFIG (the fused ops)."""
    m = re.fullmatch(r"(CODA_[A-Z0-9_]+)=(.*)", pin)
    if m:
        return m.group(1), m.group(2)
    return ("CODA_GEMM_CONFIG" if op in ("gemm_gu", "gemm_down") else "CODA_OP_CONFIG"), pin


def floor_pins(coda_pins):
    """The --coda-pins entries that also pin `coda_rowscale` (linear_rowscale): a CODA_* variable or CODA_OP_CONFIG's
    global form `<config>[:<knobs>]`; a per-op entry (`<op>=<config>...`) would leave linear_rowscale unpinned."""
    return [p for p in coda_pins if re.fullmatch(r"CODA_[A-Z0-9_]+=.*", p) or "=" not in p.split(":", 1)[0]]


def with_env(var, value, fn):
    """fn with the environment variable var = value for the call (common.env_var), restored after."""
    def call():
        with env_var(var, value):
            return fn()
    return call


# --- measuring ------------------------------------------------------------------------------------------------------

def max_rel_err(a, b, rows=4096):
    """max |a - b| / max |b| over all elements (fp32, in chunks of rows), inf where a has a NaN/inf or the shapes
    differ."""
    a, b = torch.as_tensor(a).detach(), torch.as_tensor(b).detach()
    if a.shape != b.shape:
        return math.inf
    a2 = a.reshape(a.shape[0], -1) if a.dim() else a.reshape(1, 1)
    b2 = b.reshape(b.shape[0], -1) if b.dim() else b.reshape(1, 1)
    err = scale = 0.0
    for i in range(0, a2.shape[0], rows):
        x, y = a2[i:i + rows].float(), b2[i:i + rows].float()
        if not torch.isfinite(x).all():
            return math.inf
        err = max(err, (x - y).abs().max().item())
        scale = max(scale, y.abs().max().item())
    return err / max(scale, 1e-30)


def agreement(outs, ref_outs, pairs, tol):
    """(agrees, max_rel_err over the pairs, {name: err})."""
    errs = {}
    for name, get, get_ref in pairs:
        try:
            errs[name] = max_rel_err(get(outs), get_ref(ref_outs))
        except Exception:  # a missing output: not the same computation
            errs[name] = math.inf
    worst = max(errs.values()) if errs else None
    return (worst is not None and worst <= tol), worst, errs


def _sync(device):
    if is_cuda(device):
        torch.cuda.synchronize()


def timing(fn, reps, device):
    """One timing as common.interleaved takes it: reps back-to-back calls between CUDA events
    (common.timed_pipelined) while NvmlSampler samples clock and power. -> {"ms", "clock_mhz", "watts", ...}."""
    def measure():
        with NvmlSampler() as s:
            ms = timed_pipelined(fn, reps, warmup=0, device=device)
        return {"ms": ms, **s.summary()}
    return measure


def reps_for(ms_per_call, seconds, min_reps):
    return max(min_reps, math.ceil(1e3 * seconds / max(ms_per_call, 1e-6)))


def _err(e):
    return f"{type(e).__name__}: {e}"[:300]


def _first_call(fn, device):
    """fn's first call (compiles, caches): -> (output, {"first_call_s"}) or (None, {"error"})."""
    t0 = time.perf_counter()
    try:
        out = fn()
        _sync(device)
    except Exception as e:
        return None, {"error": _err(e)}
    return out, {"first_call_s": time.perf_counter() - t0}


def peak_mib(fn, device):
    """common.peak_extra_gib in MiB (what one call allocates above what was allocated before it: workspaces, the
    logits chunk, the outputs it returns; inputs and weights not counted); None off CUDA."""
    return peak_extra_gib(fn) * 1024 if is_cuda(device) else None


def run_case(case, t, tol, device="cuda"):
    """Runs one case: first calls and output checks, the screen of the config short list (case.pinned), the warm-up
    of every contender, then t.rounds interleaved rounds. -> ({impl: result dict}, [screen result dicts]); a result
    holds ms, clock_mhz, watts, ... or an `error`."""
    res = {impl: {} for impl in case.fns}
    kept = {}  # reference outputs, until every check is done
    refs = {ref for ref, _ in case.checks.values()}
    for impl, fn in list(case.fns.items()):
        out, res[impl] = _first_call(fn, device)
        if "error" in res[impl]:
            continue
        if impl in case.checks:
            ref, pairs = case.checks[impl]
            if ref in kept:
                ok, worst, errs = agreement(out, kept[ref], pairs, tol)
                res[impl].update(agrees=ok, max_rel_err=worst, rel_err=errs)
            else:
                res[impl]["agrees"] = None  # the reference failed
        if impl in refs:
            kept[impl] = out
        del out
        if case.op in MEMORY_OPS and not impl.endswith("_graph"):  # a second call (the first compiles and tunes)
            try:
                res[impl]["peak_mib"] = peak_mib(fn, device)
            except Exception as e:
                res[impl] = {"error": _err(e)}
    screen = []
    if case.pinned:
        s_measures, s_info = {}, {}
        check = case.checks.get("quack_best")
        for label, fn in case.pinned.items():
            out, s_info[label] = _first_call(fn, device)
            if "error" in s_info[label]:
                continue
            if check and check[0] in kept:
                ok, worst, _ = agreement(out, kept[check[0]], check[1], tol)
                s_info[label].update(agrees=ok, max_rel_err=worst)
            del out
            try:
                per_call = warm_for(fn, t.screen_warm_s, device)
            except Exception as e:
                s_info[label] = {"error": _err(e)}
                continue
            s_measures[label] = timing(fn, reps_for(per_call, t.screen_s, t.min_reps), device)
        got = interleaved(s_measures, t.screen_rounds) if s_measures else {}
        for label in case.pinned:
            r = dict(s_info.get(label, {}))
            r.update(got.get(label, {}))
            r["quack_config"] = label
            screen.append(r)
        ok = [r for r in screen if "error" not in r and "ms" in r]
        if ok:  # the fastest of the configs whose outputs agree (of all, where none does: the row says so)
            best = min([r for r in ok if r.get("agrees") is not False] or ok, key=lambda r: r["ms"])["quack_config"]
            case.fns["quack_best"] = case.pinned[best]
            case.labels["quack_best"] = best
            picked = next(r for r in screen if r["quack_config"] == best)
            res["quack_best"] = {k: v for k, v in picked.items() if k in ("first_call_s", "agrees", "max_rel_err")}
            res["quack_best"]["screen_ms"] = picked["ms"]
            if "quack_default_graph" in case.fns:  # a graphed op: quack's pick replayed too
                case.fns["quack_best_graph"] = GraphReplay(case.pinned[best])
                res["quack_best_graph"] = {}
        else:
            res["quack_best"] = {"error": "every config of --quack-configs failed: " +
                                 "; ".join(f"{r['quack_config']}: {r.get('error', '?')}" for r in screen)[:300]}
    kept.clear()
    measures = {}
    for impl, fn in case.fns.items():
        if "error" in res.get(impl, {}):
            continue
        try:
            per_call = warm_for(fn, t.warm_s, device)
        except Exception as e:
            res[impl] = {"error": _err(e)}
            continue
        reps = reps_for(per_call, t.timing_s, t.min_reps)
        res[impl].update(warm_ms_per_call=per_call, reps=reps)
        measures[impl] = timing(fn, reps, device)
    got = interleaved(measures, t.rounds)
    for impl, r in got.items():
        if "error" in r:
            res[impl] = {"error": r["error"]}
        else:
            res[impl].update(r)
            res[impl] = per_op_call(case.fns[impl], res[impl])
    return {impl: res.get(impl, {"error": "not run"}) for impl in case.fns}, screen


def make_row(op, config, shape, impl, result, commit, gpu, date, quack_config=None, screen=False, **extra):
    """One JSON line: the PROTOCOL.md keys plus this bench's (impl, quack_config, clock_mhz, watts, agrees, ...)."""
    M, N, K = shape
    row = dict(suite="block" if op == "block" else SUITE, op=op, config=config, tokens=M, M=M, N=N, K=K,
               **{"pass": PASS.get(op, "fwd")}, impl=impl, variant=impl, quack_config=quack_config, ms=None,
               clock_mhz=None, watts=None)
    row.update(result)
    ms = row.get("ms")
    w = work(op, shape, CONFIGS.get(config.lower()))
    if ms:
        if "flop" in w:
            row["tflops"] = w["flop"] / (ms * 1e9)
        elif "bytes" in w:
            row["gb_s"] = w["bytes"] / (ms * 1e6)
    if screen:
        row["screen"] = True
    row.update(extra)
    row.update(commit=commit, gpu=gpu, date=date)
    return _finite(row)


def _finite(v):
    """inf / nan as strings (strict JSON has no such numbers), recursively through dicts."""
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


# --- report ---------------------------------------------------------------------------------------------------------

def _ms(rows, impl):
    r = rows.get(impl)
    return r.get("ms") if r and "error" not in r else None


QUACK_EQUIVALENTS = ("quack_default", "quack_best", "quack", "quack_rms", "quack_norm_act")


def fastest_quack_ms(rows):
    """The least ms among the quack contenders that compute CODA's op (QUACK_EQUIVALENTS) and did not disagree with
    its outputs; None where there is none."""
    times = [_ms(rows, i) for i in QUACK_EQUIVALENTS if rows.get(i, {}).get("agrees") is not False]
    times = [t for t in times if t]
    return min(times) if times else None


def _ratio(a, b):
    return f"{a / b:.3f}" if a and b else "-"


def _cell(rows, impl):
    r = rows.get(impl)
    if r is None:
        return "-"
    if "error" in r:
        return "error"
    return f"{r['ms']:.3f}" if r.get("ms") else "-"


def _run_of(r):
    return str(r.get("date") or "")


def selected_rows(rows):
    """The rows the report shows: for each (op, config, tokens), every row (screen rows included) of the latest run
    (`date`) in which at least one of its contenders measured a time, so that a run that only failed or skipped does
    not hide an older measurement, and no ratio mixes two runs (PROTOCOL.md)."""
    latest = {}
    for r in rows:
        if not r.get("screen") and r.get("ms") and "error" not in r:
            key = (r["op"], r["config"], r["tokens"])
            latest[key] = max(latest.get(key, ""), _run_of(r))
    return [r for r in rows if latest.get((r["op"], r["config"], r["tokens"])) == _run_of(r)]


def summarize(rows):
    """rows (JSON-line dicts) -> [(op, config, tokens, {impl: row})] of selected_rows (screen rows left out), in the
    order the (op, config, tokens) first appear in rows."""
    order = {}
    for r in rows:
        order.setdefault((r["op"], r["config"], r["tokens"]), len(order))
    groups = {}
    for r in selected_rows(rows):
        if not r.get("screen"):
            groups.setdefault((r["op"], r["config"], r["tokens"]), {})[r["impl"]] = r
    return [(op, c, m, groups[(op, c, m)]) for (op, c, m) in sorted(groups, key=order.get)]


def _with_ratio(g, impl, base):
    """'ms (ms / base's ms)' of impl, 'error', or '-'."""
    cell, ms = _cell(g, impl), _ms(g, impl)
    return f"{cell} ({_ratio(ms, base)})" if ms and base else cell


def markdown_table(rows):
    """The run's table, one line per (op, config, tokens): each contender's ms with its time / cuBLAS's in brackets
    (time / time: below 1, the first named is faster), quack_best's config, CODA / quack (over the fastest quack
    contender whose outputs agree with CODA's: quack_default, quack_best, the op's one `quack` call, quack_rms or
    quack_norm_act, which compute what CODA's op does; the screen picks quack_best from short timings, so
    quack_default can come out faster), the other contenders, and the output check ("yes", or the impls that
    disagree). CODA's plain GEMM cell names the kernel its autotuner ran (`gemm_choice`) where the row has it."""
    lines = ["| op | config | tokens | cuBLAS ms | CODA ms (/ cuBLAS) | quack default ms (/ cuBLAS) | quack best ms "
             "(/ cuBLAS) | quack best config | CODA / quack | other (/ cuBLAS) | agree |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|---|---|"]
    for op, config, tokens, g in summarize(rows):
        if op == "block":
            continue  # block_table
        cb = _ms(g, "cublas_gemm")
        qname = "quack_best" if "quack_best" in g else "quack"
        best = g.get("quack_best", {})
        label = best.get("quack_config") if "error" not in best else None
        other = [f"{i} {_with_ratio(g, i, cb)}" for i in g if i not in ("cublas_gemm", "coda", "quack_default", qname)]
        errors = [i for i, r in g.items() if "error" in r]
        checked = [i for i, r in g.items() if r.get("agrees") is not None]
        bad = [i for i in checked if not g[i]["agrees"]]
        agree = ("no: " + ", ".join(bad)) if bad else ("yes" if checked else "-")
        if errors:
            agree += "; errors: " + ", ".join(errors)
        choice = g.get("coda", {}).get("gemm_choice")
        coda_cell = _with_ratio(g, "coda", cb) + (f" [{choice}]" if choice else "")
        lines.append(f"| {op} | {config} | {tokens} | {_cell(g, 'cublas_gemm')} | {coda_cell} | "
                     f"{_with_ratio(g, 'quack_default', cb)} | {_with_ratio(g, qname, cb)} | {label or '-'} | "
                     f"{_ratio(_ms(g, 'coda'), fastest_quack_ms(g))} | {'; '.join(other) or '-'} | {agree} |")
    return "\n".join(lines)


def block_table(rows):
    """The block suite's table, one line per (config, tokens): each impl's ms, torch.compile's and Liger's time over
    CODA's (above 1: CODA is faster; the issue asks >= 1.03 at 8B, 1.02 at 70B, 1.12 at 1B), and CODA's over its
    GEMMs alone (the issue asks <= 1.03). "" where there are no block rows."""
    groups = [(c, m, g) for op, c, m, g in summarize(rows) if op == "block"]
    if not groups:
        return ""
    lines = ["| config | tokens | CODA ms | torch.compile ms | Liger ms | GEMMs alone ms | compile / CODA | "
             "Liger / CODA | CODA / GEMMs alone | other |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for config, tokens, g in groups:
        coda = _ms(g, "coda")
        other = [f"{i} {_cell(g, i)}" for i in g if i not in BLOCK_IMPLS]
        lines.append(f"| {config} | {tokens} | {_cell(g, 'coda')} | {_cell(g, 'torch_compile')} | {_cell(g, 'liger')} | "
                     f"{_cell(g, 'gemm_only')} | {_ratio(_ms(g, 'torch_compile'), coda)} | "
                     f"{_ratio(_ms(g, 'liger'), coda)} | {_ratio(coda, _ms(g, 'gemm_only'))} | "
                     f"{'; '.join(other) or '-'} |")
    return "\n".join(lines)


def _joined(rows, key):
    return ", ".join(sorted({str(r[key]) for r in rows if r.get(key) is not None})) or "?"


def readme(rows, meta=None):
    """--out/README.md from the rows (every run in the folder's vs_quack.jsonl; each (op, config, tokens) from the
    latest run that measured it, selected_rows): where and how they were measured, the table, clock and power, the
    errors. meta: this run's command, planned and actual seconds, where there is one."""
    meta = meta or {}
    rows = selected_rows(rows)  # the header, errors, clocks and memory of the runs the tables show
    timed = [r for r in rows if not r.get("screen")]
    errs = [f"- {r['op']} {r['config']} {r['tokens']} {r['impl']}"
            f"{' ' + r['quack_config'] if r.get('quack_config') else ''}: {r['error']}"
            for r in rows if r.get("error")]
    clocks = [f"{r['op']} {r['config']} {r['tokens']} {r['impl']} {r['clock_mhz']:.0f} MHz {r['watts']:.0f} W"
              for r in rows if not r.get("screen") and r.get("clock_mhz") and r.get("watts")]
    screened = sorted({r["quack_config"] for r in rows if r.get("screen") and r.get("quack_config")})
    memory = [f"{r['op']} {r['config']} {r['tokens']} {r['impl']} {r['peak_mib']:.0f}"
              for r in timed if r.get("peak_mib") is not None]
    run = []
    if meta.get("command"):
        run.append(f"Command: `{meta['command']}`")
    if meta.get("estimate_s") is not None and meta.get("wall_s") is not None:
        run.append(f"Planned GPU time {meta['estimate_s']:.0f} s (quack compiles not counted); the run took "
                   f"{meta['wall_s']:.0f} s.")
    return "\n".join([
        "# CODA vs quack vs cuBLAS (bench/python/vs_quack.py)", "",
        f"{_joined(rows, 'date')}; commit {_joined(rows, 'commit')}; {_joined(rows, 'gpu')}; torch "
        f"{_joined(rows, 'torch')}; quack {_joined(rows, 'quack_version')}.", *run, "",
        f"Method: PROTOCOL.md's settled clock: each contender warmed {_joined(timed, 'warm_s')} s of back-to-back "
        f"calls, then {_joined(timed, 'rounds')} rounds in rotating order, each a ~{_joined(timed, 'timing_ms')} ms "
        "run of back-to-back calls between CUDA events with the SM clock and board power sampled during it (pynvml); "
        "medians over rounds. quack_default: tuned=False (sm90: pingpong 128x192, cluster 2x1); quack_best: the "
        f"fastest of {', '.join(screened) or 'the short list'} in a short screen (the `quack_screen` rows). Ratios "
        "are time / time: below 1, the first named is faster. `agree`: every checked output within max |a - b| / "
        f"max |b| <= {_joined(timed, 'tol')} of CODA's (cuBLAS's for the plain GEMMs).", "",
        markdown_table(rows), "",
        *(["Block forward + backward (suite `block`: bench_block.py's block, attention excluded; `GEMMs alone` its "
           "12 GEMMs through torch.mm):", "", block_table(rows), ""] if block_table(rows) else []),
        *(["Peak memory of one call above what was allocated before it (MiB; workspaces, the logits chunk, the "
           "outputs and gradients it returns; the inputs and weights not counted):", "", "; ".join(memory), ""]
          if memory else []),
        "Clock and power during each contender's timing (medians over rounds):", "",
        "; ".join(clocks) or "(not sampled: pynvml missing)", "",
        "Errors:" if errs else "No errors.", *errs, ""])


def read_rows(path):
    """The rows of a vs_quack.jsonl (none where it does not exist)."""
    import json
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def main(argv=None):
    a = parse_args(argv)
    t = a.timing
    est = estimate_seconds(a.ops, a.configs, a.tokens, t, a.quack, len(a.quack_configs), coda_pins=a.coda_pins,
                           graph_ops=a.graph_ops)
    print(f"vs_quack: {len(a.ops)} ops x {len(a.configs)} configs x {len(a.tokens)} token counts; planned GPU time "
          f"~{est:.0f} s ({est / 60:.1f} min) plus quack's first-call compiles", flush=True)
    if a.estimate:
        return 0
    if a.report:
        if not a.out:
            print("vs_quack: --report needs --out DIR (holding vs_quack.jsonl)", file=sys.stderr)
            return 2
        rows = read_rows(a.out / "vs_quack.jsonl")
        (a.out / "README.md").write_text(readme(rows))
        print(markdown_table(rows))
        return 0
    cuda = is_cuda(DEVICE)
    if cuda and not torch.cuda.is_available():
        print("vs_quack: no CUDA GPU", file=sys.stderr)
        return 1
    quack, why = (load_quack() if a.quack else (None, "--no-quack"))
    if a.quack and quack is None:
        print(f"vs_quack: quack not usable, CODA and cuBLAS only: {why}", flush=True)
    elif quack:
        print(f"vs_quack: quack {quack.version}; cache-key wrapper on {quack.patched} module attribute(s)",
              flush=True)
    commit = a.commit or git_commit()
    gpu = torch.cuda.get_device_name() if cuda else DEVICE
    date = datetime.datetime.now().isoformat(timespec="seconds")
    out_jsonl = a.out / "vs_quack.jsonl" if a.out else None
    run_fields = dict(torch=torch.__version__, quack_version=quack.version if quack else None, warm_s=t.warm_s,
                      timing_ms=round(1e3 * t.timing_s, 3), tol=a.tol)
    rows, start = [], time.perf_counter()
    for M in a.tokens:
        for config in a.configs:
            cfg = CONFIGS[config.lower()]
            for op in a.ops:
                shape = op_shape(op, cfg, M)
                new = []
                if a.deadline_min is not None and time.perf_counter() - start > 60 * a.deadline_min:
                    new = [make_row(op, config, shape, impl, {"error": f"skipped: --deadline-min {a.deadline_min}"},
                                    commit, gpu, date, **run_fields)
                           for impl in contenders(op, quack is not None, a.coda_pins, a.graph_ops)]
                else:
                    try:
                        case = build_case(op, cfg, M, quack, a.quack_configs, device=DEVICE, coda_pins=a.coda_pins,
                                          graph_ops=a.graph_ops)
                        results, screen = run_case(case, t, a.tol, device=DEVICE)
                    except Exception as e:  # the inputs or a reference could not be built: one row per contender
                        case, screen = None, []
                        results = {impl: {"error": _err(e)}
                                   for impl in contenders(op, quack is not None, a.coda_pins, a.graph_ops)}
                    for impl, r in results.items():
                        label = case.labels.get(impl) if case else None
                        choice = {"gemm_choice": case.choices[impl]} if case and impl in case.choices else {}
                        new.append(make_row(op, config, shape, impl, r, commit, gpu, date, quack_config=label,
                                            **run_fields, **(case.info if case else {}), **choice))
                    if a.quack and quack is None:
                        new.append(make_row(op, config, shape, "quack", {"error": why}, commit, gpu, date,
                                            **run_fields))
                    for r in screen:
                        new.append(make_row(op, config, shape, "quack_screen", {k: v for k, v in r.items()
                                                                              if k != "quack_config"},
                                            commit, gpu, date, quack_config=r["quack_config"], screen=True,
                                            **run_fields))
                    del case
                    if cuda:
                        torch.cuda.empty_cache()
                append_jsonl(out_jsonl, new)
                rows += new
                brief = ", ".join(f"{r['impl']} {r['ms']:.3f}" if r.get("ms") else f"{r['impl']} error"
                                  for r in new if not r.get("screen"))
                print(f"[{time.perf_counter() - start:6.0f} s] {op} {config} M={M}: {brief}", flush=True)
    wall = time.perf_counter() - start
    table = markdown_table(rows)
    print("\n" + table)
    if a.out:  # the README covers every run in the folder's JSON lines (e.g. an 8192 and a 16384 call)
        meta = dict(command=" ".join(sys.argv), estimate_s=est, wall_s=wall)
        (a.out / "README.md").write_text(readme(read_rows(out_jsonl), meta))
        print(f"\nwrote {out_jsonl} and {a.out / 'README.md'} ({wall:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
