"""One command for the Python-side benchmark suite: runs the block, LM-head and end-to-end benchmarks and
the training comparison, then writes JSON lines, PNG plots and a Markdown report into one folder.

    python bench/python/report.py                      # everything, into bench/results/python_<commit>/
    python bench/python/report.py --quick              # fewer configs and steps (a smoke run)
    python bench/python/report.py --only block,lm_head # some parts (gemm, ops, block, lm_head, e2e, train)
    python bench/python/report.py --out /tmp/r        # elsewhere than bench/results/python_<commit>/
    python bench/python/report.py --render DIR         # re-render DIR's report.md and plots from its JSON lines

Needs an sm_90 GPU (it stops at once without one), libcoda (tools/build or pip install .), transformers and, for
its Liger columns, liger-kernel (pip install liger-kernel; offline: tools/fetch-wheels, then pip install .whl/*).
Exits non-zero when a part fails (the report still has the others; each part's log is in the folder).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def commit():
    """HEAD's short hash, with "-dirty" when tracked files differ from it (a copy of a working tree whose .git is an
    older snapshot reads as its snapshot's commit otherwise); "unknown" without git."""
    def git(*args):
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    try:
        head = git("rev-parse", "--short", "HEAD")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    try:
        dirty = git("status", "--porcelain", "--untracked-files=no") != ""
    except (OSError, subprocess.CalledProcessError):
        dirty = True  # no answer: do not claim a clean tree
    return head + ("-dirty" if dirty else "")


FAILED = []  # (part's log, its last line) of every part that exited non-zero


def run(cmd, log):
    print("$", " ".join(map(str, cmd)), flush=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(log, "w") as f:
        rc = subprocess.run(list(map(str, cmd)), stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    print(f"  rc={rc}, log {log}", flush=True)
    if rc != 0:
        lines = [ln for ln in Path(log).read_text(errors="replace").splitlines() if ln.strip()]
        FAILED.append((log, lines[-1] if lines else "(empty log)"))
        print(f"  FAILED: {FAILED[-1][1]}", flush=True)
    return rc


PARTS = ("gemm", "ops", "block", "lm_head", "e2e", "train")


def gpu_problem():
    """Why this machine cannot run the suite (the benchmarks time CODA's sm_90 kernels), or None."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed (tools/install-deps --python)"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible (the suite needs an NVIDIA Hopper GPU, sm_90: H100/H200)"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"the GPU is sm_{major}{minor}; CODA's kernels need sm_90 (H100/H200)"
    return None


def load(path):
    return [json.loads(line) for line in open(path)] if path.exists() else []


def bars(path, title, groups, series, values, ylabel, log=False):
    """Grouped bar chart: values[(group, series)] -> number (log: a log y axis, for ratios far apart)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups)), 4.2))
    width = 0.8 / max(1, len(series))
    for i, s in enumerate(series):
        xs = [j + i * width for j in range(len(groups))]
        ax.bar(xs, [values.get((g, s), 0.0) for g in groups], width, label=s)
    ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(groups))], groups, fontsize=8)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path.name


def fmt(x, spec):
    """x formatted, or "-" where it was not measured (None or NaN: e.g. memory on a CPU smoke run)."""
    return "-" if x is None or x != x else format(x, spec)


def render(out: Path):
    timed_rows = [r for name in ("block.jsonl", "lm_head.jsonl", "ops.jsonl") for r in load(out / name)
                  if "error" not in r]
    e2e_rows = [r for name in ("e2e.jsonl", "e2e_adamw.jsonl") for r in load(out / name) if "error" not in r]
    took_turns = (bool(timed_rows or e2e_rows) and all("rounds" in r for r in timed_rows)
                  and all(r.get("rounds", 1) > 1 for r in e2e_rows))
    turns = ("" if not (timed_rows or e2e_rows) else
             "The implementations of a table took turns (rotating order over rounds, median)." if took_turns else
             "Within some or all tables the implementations ran one after the other, CODA first: on the H200 that "
             "order alone moved ratios by up to 12 % in a GEMM bench (bench/results/gemm_torch_h200_ba4949a.md), "
             "so read differences of a few percent as ties.")
    md = [f"# CODA vs PyTorch, torch.compile and Liger ({out.name})", "",
          "Generated by bench/python/report.py. Ratios are other implementation's time / CODA's (above 1: CODA is "
          "faster); each table's rows come from one run. " + turns, ""]
    blk = [r for r in load(out / "block.jsonl") if "error" not in r]
    if blk:
        md += ["## Block forward + backward (attention excluded)", "",
               "Per call: each call synchronized (host time before the first kernel counts). Back to back: calls "
               "enqueued ahead of the GPU, as in a training loop.", "",
               "| config | tokens | impl | fwd ms | bwd ms | f+b ms | f+b vs CODA | f+b back to back ms | its vs CODA "
               "| peak extra GiB |",
               "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
        nan = float("nan")
        for r in blk:
            md.append(f"| {r['config']} | {r['tokens']} | {r['impl']} | {r['forward_ms']:.2f} | {r['backward_ms']:.2f} "
                      f"| {r['fwd_bwd_ms']:.2f} | {r.get('fwd_bwd_vs_coda', nan):.3f} | "
                      f"{r.get('fwd_bwd_pipelined_ms', nan):.2f} | {r.get('fwd_bwd_pipelined_vs_coda', nan):.3f} | "
                      f"{fmt(r['peak_extra_gib'], '.2f')} |")
        groups = list(dict.fromkeys(f"{r['config']}:{r['tokens']}" for r in blk))  # in the order measured
        series = [s for s in ("eager", "compile", "liger") if any(r["impl"] == s for r in blk)]
        vals = {(f"{r['config']}:{r['tokens']}", r["impl"]): r.get("fwd_bwd_vs_coda", 0) for r in blk}
        png = bars(out / "block.png", "Block forward+backward: time / CODA's time", groups, series, vals, "ratio")
        md += ["", f"![block]({png})" if png else "", ""]
    gemm = [r for r in load(out / "gemm.jsonl") if "error" not in r]
    if gemm:
        md += ["## CODA's plain GEMM vs torch.matmul (interleaved)", "",
               "The mainloop every fused op is built on, at the block's GEMM shapes; `its cuBLAS` is libcoda's own "
               "cuBLAS call (the same kernel as torch.matmul's: a check of the method).", "",
               "| config | tokens | gemm | M | N | K | torch ms | CODA ms | CODA / torch | its cuBLAS / torch |",
               "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in gemm:
            md.append(f"| {r['config']} | {r['tokens']} | {r['gemm']} | {r['M']} | {r['N']} | {r['K']} | "
                      f"{r['torch_ms']:.3f} | {r['coda_ms']:.3f} | {r['coda_over_torch']:.3f} | "
                      f"{r['coda_cublas_over_torch']:.3f} |")
        md += ["", f"Geometric mean CODA / torch over {len(gemm)} GEMMs: "
               f"{statistics.geometric_mean(r['coda_over_torch'] for r in gemm):.3f}.", ""]
    ops = [r for r in load(out / "ops.jsonl") if "error" not in r]
    if ops:
        md += ["## Fused ops, forward and forward + backward", "",
               "`gemm_only` is the op's GEMMs through cuBLAS with nothing else (the floor a fused op aims at).", "",
               "| op | config | impl | fwd ms | f+b ms | fwd vs CODA | f+b vs CODA |", "|---|---|---|---:|---:|---:|---:|"]
        for r in ops:
            md.append(f"| {r['op']} | {r['config']} | {r['impl']} | {r['forward_ms']:.3f} | {r['fwd_bwd_ms']:.3f} | "
                      f"{r.get('forward_vs_coda', float('nan')):.3f} | {r.get('fwd_bwd_vs_coda', float('nan')):.3f} |")
        md.append("")
    lm = [r for r in load(out / "lm_head.jsonl") if "error" not in r]
    if lm:
        base = next((r for r in lm if r["impl"] == "coda"), lm[0])
        vs = "CODA" if base["impl"] == "coda" else base["impl"] + " (CODA failed)"
        md += ["## LM head + cross-entropy, forward + backward", "",
               f"| tokens | impl | fwd ms | f+b ms | f+b vs {vs} | peak extra GiB |", "|---:|---|---:|---:|---:|---:|"]
        for r in lm:
            md.append(f"| {r['tokens']} | {r['impl']} | {r['forward_ms']:.2f} | {r['fwd_bwd_ms']:.2f} | "
                      f"{r['fwd_bwd_ms'] / base['fwd_bwd_ms']:.3f} | {fmt(r['peak_extra_gib'], '.2f')} |")
        series = [r["impl"] for r in lm if r is not base]
        vals = {}
        for r in lm:
            vals[("f+b time", r["impl"])] = r["fwd_bwd_ms"] / base["fwd_bwd_ms"]
            if r["peak_extra_gib"] is not None and base["peak_extra_gib"] is not None:
                vals[("peak extra memory", r["impl"])] = r["peak_extra_gib"] / max(base["peak_extra_gib"], 1e-9)
        png = bars(out / "lm_head.png", "LM head + CE (llama3-1B): other / CODA's", ["f+b time", "peak extra memory"],
                   series, vals, "ratio (log)", log=True)
        md += ["", f"![lm_head]({png})" if png else "", ""]
    e2e_vals, e2e_groups, e2e_series = {}, [], []
    for name, title in (("e2e.jsonl", "End-to-end training step (forward + backward)"),
                        ("e2e_adamw.jsonl", "End-to-end training step with AdamW")):
        rows = load(out / name)
        if not rows:
            continue
        group = "with AdamW" if "adamw" in name else "forward + backward"
        ref = next((r for r in rows if r["impl"] == "coda" and "error" not in r), None)
        r0 = rows[0]
        md += [f"## {title}: {r0['shape']}, {r0['batch']} x {r0['seq']} tokens", "",
               "| impl | step ms | tokens/s | CODA's tokens/s over it | peak GiB | first-step loss | SM clock MHz, power W |",
               "|---|---:|---:|---:|---:|---:|---|"]
        for r in rows:
            if "error" in r:
                md.append(f"| {r['impl']} | {r['error'][:100]} | | | | | |")
                continue
            ratio = ref["tokens_per_s"] / r["tokens_per_s"] if ref else float("nan")
            tele = f"{r['sm_clock_mhz']:.0f}, {r['power_w']:.0f}" if "sm_clock_mhz" in r else "-"
            md.append(f"| {r['impl']} | {r['step_ms']:.1f} | {r['tokens_per_s']:,.0f} | {ratio:.3f} | "
                      f"{fmt(r['peak_mem_gib'], '.1f')} | {r['first_loss']:.5f} | {tele} |")
            if ref and r is not ref:
                e2e_vals[(group, r["impl"])] = ratio
                e2e_series += [r["impl"]] if r["impl"] not in e2e_series else []
        e2e_groups.append(group)
        md.append("")
    if e2e_vals:
        png = bars(out / "e2e.png", "Training step (llama3-1B shape): step time / CODA's", e2e_groups, e2e_series,
                   e2e_vals, "ratio")
        md += [f"![e2e]({png})" if png else "", ""]
    summary = out / "train" / "summary.json"
    if summary.exists():
        md += ["## Training run (python -m coda.train --compare)", "", "| model | final train loss | final val loss | "
               "tokens/s | peak GiB |", "|---|---:|---:|---:|---:|"]
        for s in json.loads(summary.read_text()):
            md.append(f"| {s['model']} | {s['final_train_loss']:.4f} | {s['final_val_loss']:.4f} | "
                      f"{s['tokens_per_s'] or 0:,.0f} | {s['peak_mem_gib']:.2f} |")
        md += ["", "![loss](train/loss.png)", ""]
    (out / "report.md").write_text("\n".join(md) + "\n")
    print(f"report: {out / 'report.md'}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None, help="results folder (default: bench/results/python_<commit>)")
    p.add_argument("--quick", action="store_true", help="fewer configs and steps: a smoke run")
    p.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts, of: {', '.join(PARTS)}")
    p.add_argument("--render", type=Path, default=None, metavar="DIR",
                   help="only re-render DIR's report.md and plots from its JSON lines (no GPU needed)")
    p.add_argument("--commit", default=None, help="commit recorded in the results (default: git, else $CODA_COMMIT)")
    a = p.parse_args()
    if a.render:
        return render(a.render)
    parts = a.only.split(",")
    unknown = [x for x in parts if x not in PARTS]
    if unknown:
        p.error(f"--only: unknown part(s) {', '.join(unknown)}; the parts are {', '.join(PARTS)}")
    why = gpu_problem()
    if why:
        sys.exit(f"report.py: {why}. Nothing was run. (--render DIR re-renders existing results without a GPU.)")
    c = a.commit or os.environ.get("CODA_COMMIT") or commit()
    out = a.out or ROOT / "bench" / "results" / f"python_{c}"
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    if "block" in parts:
        cfgs = "llama3-1b:8192" if a.quick else "llama3-1b:8192,llama3-1b:32768,llama3-8b:8192,llama3-70b:8192"
        run([py, HERE / "bench_block.py", "--configs", cfgs, "--out", out / "block.jsonl", "--commit", c],
            out / "block.log")
    if "gemm" in parts:
        run([py, HERE / "bench_gemm.py", "--configs", "llama3-1b" if a.quick else "llama3-1b,llama3-8b",
             "--tokens", "8192" if a.quick else "8192,16384", "--out", out / "gemm.jsonl", "--commit", c],
            out / "gemm.log")
    if "ops" in parts:
        run([py, HERE / "bench_ops.py", "--configs", "llama3-1b" if a.quick else "llama3-1b,llama3-8b,llama3-70b",
             "--out", out / "ops.jsonl", "--commit", c], out / "ops.log")
    if "lm_head" in parts:
        run([py, HERE / "bench_lm_head.py", "--tokens", "8192", "--out", out / "lm_head.jsonl", "--commit", c],
            out / "lm_head.log")
    if "e2e" in parts:
        e2e = ["--batch", "4", "--seq", "8192"] + (["--layers", "2", "--steps", "2", "--warmup", "1"] if a.quick
                                                   else ["--rounds", "2"])
        run([py, HERE / "bench_e2e.py", *e2e, "--out", out / "e2e.jsonl", "--commit", c], out / "e2e.log")
        run([py, HERE / "bench_e2e.py", *e2e, "--optimizer", "--out", out / "e2e_adamw.jsonl", "--commit", c],
            out / "e2e_adamw.log")
    if "train" in parts:
        steps = ["--steps", "200"] if a.quick else []
        run([py, "-m", "coda.train", "--compare", "--no-progress", "--no-save", *steps, "--out", out / "train"],
            out / "train.log")
    render(out)
    if FAILED:
        print(f"report.py: {len(FAILED)} part(s) failed; the report has the others:", file=sys.stderr)
        for log, last in FAILED:
            print(f"  {log}: {last}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
