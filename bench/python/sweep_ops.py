"""Fused-op config and knob choice under sustained load (docs/FUSED_OPS.md, "Choosing and pinning a kernel").

    python bench/python/sweep_ops.py --ops linear_rowscale_swiglu,linear_rowscale_lse \\
        --configs llama3-70b:8192,llama3-8b:16384 [--pins 'PIN;PIN']

For each (op, model config, tokens), the op's candidates (`CODA_OP_CONFIG` pins, `config[:knobs]`, read by libcoda
on every call; `default` = no pin, the dispatcher's own choice) and the cuBLAS GEMM of the op's shape
(torch.matmul, bf16) take turns over --rounds rounds (common.interleaved: the order rotates by one per round), each
timed as --reps back-to-back calls (common.timed_pipelined) so the card stays loaded as in a training step. After
each timing the SM clock (MHz) and board power (W) are read (torch.cuda.clock_rate / power_draw): at the 700 W
limit a kernel can lose time to clock rather than instructions, and bench_fused --sweep, which times its points
one after another, drifted 2-5 % against its own main measurement (bench/results/fused_sweep_h200_d6e113e/).

Ops (their GEMM shapes as in bench_fused; an op that runs at several GEMMs is named `op@gemm`):
linear_residual_rmsnorm@out (o-projection + residual + RMSNorm partials), linear_residual_rmsnorm@down
(down-projection, the same epilogue), linear_rowscale_swiglu (gate/up + SwiGLU, interleaved weight),
linear_rowscale_rope (q/k/v + RoPE), linear_rowscale_qk_norm_rope (the same with Qwen3's per-head q/k RMSNorm,
storing z), linear_rowscale_lse (LM head + log-sum-exp through coda_linear_cross_entropy with one chunk:
linear_rowscale_lse without stored logits plus its small finishing kernels; V = 128256), linear_rowscale@lm_head
(linear_rowscale at the LM head's shape: one chunk of its training pass); backward:
linear_residual_rmsnorm_bwd@qkv, @gate_up and @lm_head (the dgrad of the q/k/v and of the gate/up projection with the
norm backward, dx_in given; of the LM head, K = V, alpha = 1/M) and linear_swiglu_bwd_zdz (the down projection's
dgrad with the SwiGLU backward); plain: gemm_gu and gemm_down (coda_gemm at the gate/up and down shapes) and
wgrad_o, wgrad_gu, wgrad_down, wgrad_qkv (the block's weight gradients, dW = dz^T a with K = tokens), pinned through
CODA_GEMM_CONFIG; `default` is coda_gemm's autotuned pick.
Default pins: `default` and every config the op has compiled in bf16 (fused ops: the list libcoda gives,
coda_fused_op_configs; plain forward: the seven configs of docs/GEMM.md; wgrad: stream-K, cooperative and
pingpong) x raster n/m x swizzle 1/2/4/8. (Stop 17's run 4 also timed a pingpong 128x128 with a
2x2 cluster, built for that run only: bench/results/sweep_ops_h200/.)

Prints, per (op, config, tokens), the candidates sorted by median time: ms, time / cuBLAS, median clock and power;
--out appends one JSON line per candidate. `default (repeat)` times the default a second time, as its own
candidate (--no-noise leaves it out): the difference between the two copies, printed as the noise floor, is how
far apart two candidates must be before the ranking means anything (1-3 % on 70B shapes, up to 5-9 % on
sub-millisecond ones at stop 17).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from common import CONFIGS, QK_EPS, append_jsonl, env_var, fused_configs, interleaved, last_gemm_choice, timed_pipelined

from coda import _C, _kernels

# The fused op (libcoda's name) each sweep op times; its candidates are the configs libcoda compiles for it.
FUSED_OP_OF = {"linear_residual_rmsnorm@out": "linear_residual_rmsnorm",
               "linear_residual_rmsnorm@down": "linear_residual_rmsnorm", "linear_rowscale@lm_head": "linear_rowscale",
               "linear_rowscale_swiglu": "linear_rowscale_swiglu", "linear_rowscale_rope": "linear_rowscale_rope",
               "linear_rowscale_qk_norm_rope": "linear_rowscale_qk_norm_rope",
               "linear_rowscale_lse": "linear_rowscale_lse",
               "linear_residual_rmsnorm_bwd@qkv": "linear_residual_rmsnorm_bwd",
               "linear_residual_rmsnorm_bwd@gate_up": "linear_residual_rmsnorm_bwd",
               "linear_residual_rmsnorm_bwd@lm_head": "linear_residual_rmsnorm_bwd",
               "linear_swiglu_bwd_zdz": "linear_swiglu_bwd_zdz"}
# coda_gemm: pinned through CODA_GEMM_CONFIG, `default` = its autotuned pick
PLAIN_OPS = ("gemm_gu", "gemm_down", "wgrad_o", "wgrad_gu", "wgrad_down", "wgrad_qkv")
# compiled for the forward layout (docs/GEMM.md)
PLAIN_CONFIGS = ("coop_128x256x64_c2x1", "coop_128x256x64_c1x1", "pp_128x128x64_c2x1", "pp_64x256x64_c2x1",
                 "coop_256x128x64_c1x2", "sk_128x256x64_c2x1", "pp_128x192x64_c2x1")
WGRAD_CONFIGS = ("sk_128x256x64_c2x1", "coop_128x256x64_c2x1", "pp_128x128x64_c2x1")  # compiled for wgrad bf16
VOCAB = 128256


def default_pins(op="linear_rowscale_swiglu"):
    pins = ["default"]
    configs = (WGRAD_CONFIGS if op.startswith("wgrad") else PLAIN_CONFIGS if op in PLAIN_OPS
               else fused_configs(FUSED_OP_OF[op]))
    for c in configs:
        pins += [f"{c}:raster={r},swizzle={s}" for r in "nm" for s in (1, 2, 4, 8)]
    return pins


def plain_gemm(A, B, device):
    """coda_gemm D = A B^T as a call without arguments. Its workspace covers the tuner's candidates; a pin that needs
    more fails loudly (CODA_ERROR_WORKSPACE), never silently."""
    from bench_gemm import coda_gemm_call
    D = torch.empty(A.shape[0], B.shape[0], device=device, dtype=torch.bfloat16)
    return coda_gemm_call(A, B, D, torch.device(device), _C.stream(torch.device(device)))


def make_op(op, cfg, M, device="cuda"):
    """(call, (M, N, K) of its GEMM, cuBLAS call of that shape) for one op at one model config."""
    d, F, hq, hkv, hd = cfg
    g = torch.Generator(device=device).manual_seed(0)

    def rand(*shape, std=1.0):
        return (torch.randn(*shape, device=device, generator=g) * std).to(torch.bfloat16)
    rstd = torch.rand(M, device=device, generator=g) + 0.5
    if op in ("gemm_gu", "gemm_down"):  # the plain GEMM (coda_gemm) of the gate/up or the down projection
        K, N = (d, 2 * F) if op == "gemm_gu" else (F, d)
        a, w = rand(M, K), rand(N, K, std=K ** -0.5)
        return plain_gemm(a, w, device), (M, N, K), (lambda: torch.matmul(a, w.t()))
    if op in PLAIN_OPS:  # a weight gradient dW [rows, cols] = dz^T a, K = M tokens (wgrad layout: both views)
        rows, cols = {"wgrad_o": (d, hq * hd), "wgrad_gu": (2 * F, d), "wgrad_down": (d, F),
                      "wgrad_qkv": ((hq + 2 * hkv) * hd, d)}[op]
        dz, a = rand(M, rows), rand(M, cols)
        return plain_gemm(dz.t(), a.t(), device), (rows, cols, M), (lambda: torch.matmul(dz.t(), a))
    if op in ("linear_residual_rmsnorm@out", "linear_residual_rmsnorm@down"):
        K = hq * hd if op == "linear_residual_rmsnorm@out" else F
        a, w, residual = rand(M, K), rand(d, K, std=K ** -0.5), rand(M, d, std=4.0)
        gamma = 1 + rand(d, std=0.1)
        return (lambda: _kernels.linear_residual_rmsnorm(a, w, residual, gamma, 1e-6)), (M, d, K), \
            (lambda: torch.matmul(a, w.t()))
    h = rand(M, d, std=4.0)
    if op == "linear_rowscale_swiglu":
        w = rand(2 * F, d, std=d ** -0.5)
        return (lambda: _kernels.linear_rowscale_swiglu(h, w, rstd)), (M, 2 * F, d), (lambda: torch.matmul(h, w.t()))
    if op == "linear_rowscale_rope":
        N = (hq + 2 * hkv) * hd
        w = rand(N, d, std=d ** -0.5)
        pos = (torch.arange(M, device=device) % 8192).to(torch.int32)
        inv = 1.0 / 500000.0 ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd)
        return (lambda: _kernels.linear_rowscale_rope(h, w, rstd, pos, inv, hq, hkv, hd)), (M, N, d), \
            (lambda: torch.matmul(h, w.t()))
    if op == "linear_rowscale_qk_norm_rope":
        N = (hq + 2 * hkv) * hd
        w = rand(N, d, std=d ** -0.5)
        pos = (torch.arange(M, device=device) % 8192).to(torch.int32)
        inv = 1.0 / 500000.0 ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd)
        gq = 1 + 0.1 * torch.randn(hd, device=device, generator=g)
        gk = 1 + 0.1 * torch.randn(hd, device=device, generator=g)
        return (lambda: _kernels.linear_rowscale_qk_norm_rope(h, w, rstd, gq, gk, pos, inv, hq, hkv, hd, QK_EPS)), \
            (M, N, d), (lambda: torch.matmul(h, w.t()))
    if op == "linear_rowscale_lse":
        w = rand(VOCAB, d, std=d ** -0.5)
        targets = torch.randint(0, VOCAB, (M,), device=device, generator=g)
        return (lambda: _kernels.linear_cross_entropy(h, w, rstd, targets, -100, "mean", 0.0, 0.0, 0.0, M)), \
            (M, VOCAB, d), (lambda: torch.matmul(h, w.t()))
    if op in ("linear_residual_rmsnorm_bwd@qkv", "linear_residual_rmsnorm_bwd@gate_up"):
        Kd = (hq + 2 * hkv) * hd if op.endswith("@qkv") else 2 * F
        dz, w = rand(M, Kd), rand(Kd, d, std=Kd ** -0.5)
        x, dx_in = rand(M, d, std=4.0), rand(M, d)
        gamma, zdz = 1 + rand(d, std=0.1), torch.randn(M, device=device, generator=g)
        return (lambda: _kernels.linear_residual_rmsnorm_bwd(dz, w, x, gamma, rstd, zdz, dx_in, 1.0)), (M, d, Kd), \
            (lambda: torch.matmul(dz, w))
    if op == "linear_rowscale@lm_head":  # one chunk of the LM head's training pass: logits = diag(rstd) h w^T
        w = rand(VOCAB, d, std=d ** -0.5)
        return (lambda: _kernels.linear_rowscale(h, w, rstd)), (M, VOCAB, d), (lambda: torch.matmul(h, w.t()))
    if op == "linear_residual_rmsnorm_bwd@lm_head":  # one LM head chunk's dgrad (K = V) + the final norm's backward
        dz, w = rand(M, VOCAB, std=1e-3), rand(VOCAB, d, std=d ** -0.5)
        x, gamma, zdz = rand(M, d, std=4.0), 1 + rand(d, std=0.1), torch.randn(M, device=device, generator=g)
        return (lambda: _kernels.linear_residual_rmsnorm_bwd(dz, w, x, gamma, rstd, zdz, None, 1.0 / M)), \
            (M, d, VOCAB), (lambda: torch.matmul(dz, w))
    if op == "linear_swiglu_bwd_zdz":
        dx, w_down, z = rand(M, d), rand(d, F, std=d ** -0.5), rand(M, 2 * F)
        return (lambda: _kernels.linear_swiglu_bwd_zdz(dx, w_down, z)), (M, F, d), (lambda: torch.matmul(dx, w_down))
    raise ValueError(f"--ops: unknown op {op!r} ({', '.join((*FUSED_OP_OF, *PLAIN_OPS))})")


def pinned(pin, fn, var="CODA_OP_CONFIG"):
    """fn with the environment variable `var` set to pin for the call (unset for `default`), restored after."""
    def call():
        with env_var(var, None if pin == "default" else pin):
            return fn()
    return call


REPEAT = "default (repeat)"


def noise_floor(got):
    """|a - b| / min(a, b) between the two copies of `default`, or None when either is missing or failed."""
    a, b = got.get("default", {}).get("ms"), got.get(REPEAT, {}).get("ms")
    if a is None or b is None:
        return None
    return abs(a - b) / min(a, b)


def measure(fn, reps):
    def run():
        ms = timed_pipelined(fn, reps)
        return {"ms": ms, "clock_mhz": float(torch.cuda.clock_rate()), "power_w": torch.cuda.power_draw() / 1000.0}
    return run


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ops", default="linear_rowscale_swiglu,linear_rowscale_lse")
    p.add_argument("--configs", default="llama3-70b:8192")
    p.add_argument("--pins", default=None,
                   help="';'-separated CODA_OP_CONFIG values (knobs contain commas), e.g. "
                        "'default;coop_128x256x64_c2x1:raster=n,swizzle=2' (default: see the docstring)")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-noise", dest="noise", action="store_false",
                   help="leave out the second copy of `default` that measures the run's noise floor")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--commit", default="unknown")
    args = p.parse_args()
    for spec in args.configs.split(","):
        name, tokens = spec.split(":")
        for op in args.ops.split(","):
            fn, (M, N, K), cublas = make_op(op, CONFIGS[name], int(tokens))
            cands = {"cublas": measure(cublas, args.reps)}
            pins = [x for x in args.pins.split(";") if x] if args.pins else default_pins(op)
            var = "CODA_GEMM_CONFIG" if op in PLAIN_OPS else "CODA_OP_CONFIG"
            for pin in pins:
                cands[pin] = measure(pinned(pin, fn, var), args.reps)
            if args.noise and "default" in pins:  # the same candidate twice: the run's own noise floor
                cands[REPEAT] = measure(pinned("default", fn, var), args.reps)
            got = interleaved(cands, args.rounds)
            base = got["cublas"].get("ms")
            print(f"\n{op} {name} M={M} N={N} K={K}: {args.rounds} rounds x {args.reps} back-to-back calls")
            if op in PLAIN_OPS and "default" in pins:
                pinned("default", fn, "CODA_GEMM_CONFIG")()
                print(f"default = {last_gemm_choice()}")
            print("| candidate | ms | time / cuBLAS | MHz | W |")
            print("|---|---:|---:|---:|---:|")
            rows = []
            for cand, r in sorted(got.items(), key=lambda kv: kv[1].get("ms", float("inf"))):
                if "error" in r:
                    print(f"| {cand} | error: {r['error']} | | | |")
                    continue
                ratio = r["ms"] / base if base else None  # None when the cuBLAS candidate failed
                shown = "n/a" if ratio is None else f"{ratio:.3f}"
                print(f"| {cand} | {r['ms']:.4f} | {shown} | {r['clock_mhz']:.0f} | {r['power_w']:.0f} |")
                rows.append(dict(op=op, config=name, M=M, N=N, K=K, candidate=cand, time_vs_cublas=ratio,
                                 commit=args.commit, **r))
            append_jsonl(args.out, rows)
            spread = noise_floor(got)
            if spread is not None:
                print(f"noise floor: `default` and `{REPEAT}` (the same candidate) differ by {100 * spread:.1f} %")


if __name__ == "__main__":
    main()
