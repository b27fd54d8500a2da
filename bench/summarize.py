#!/usr/bin/env python3
"""Turns benchmark JSON lines (bench/results/*.jsonl) into a Markdown summary.

Usage: bench/summarize.py RESULTS.jsonl [...] [-o SUMMARY.md]

For the gemm suite: one row per shape with cuBLAS and CODA (variant "coda": the autotuned choice) TFLOP/s, their
ratio measured in the same run, the winning config, then the geometric mean and the minimum of the ratios.
Per-config variants ("coda:<config>") are summarised as the best config per shape.
For the fused suite: one row per op and shape with the cuBLAS GEMM of the same M, N, K, CODA's fused op and the
unfused pipeline (times in ms, ratios within the run), then geometric means over the issue's set (each fused op at
its own GEMM: linear_residual_rmsnorm at out/down, linear_rowscale_swiglu at gate/up, linear_rowscale_rope at qkv,
linear_rowscale_lse at the LM head; not linear_rowscale). The fused_sweep and backward_sweep suites
(bench_fused / bench_backward --sweep) are summarised as the best pinned config x knobs per shape next to the
defaults' ratios.
"""
import argparse
import json
import math
import sys
from collections import OrderedDict


def load(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            for line in f:
                line = line.strip()
                if line:
                    rows.append(json.loads(line))
    return rows


def gemm_table(rows):
    shapes = OrderedDict()
    for r in rows:
        if r.get("suite") != "gemm":
            continue
        key = (r["config"], r["op"], r["pass"], r["M"], r["N"], r["K"], r.get("dtype_d", ""))
        shapes.setdefault(key, {})[r["variant"]] = r
    out = []
    out.append("| config | op | pass | M | N | K | out | cuBLAS TFLOP/s | CODA TFLOP/s | CODA/cuBLAS | winner | best fixed config |")
    out.append("|---|---|---|---:|---:|---:|---|---:|---:|---:|---|---|")
    ratios = []
    for key, v in shapes.items():
        cfg, op, ps, m, n, k, dd = key
        cub = v.get("cublas")
        coda = v.get("coda")
        fixed = [(x["tflops"], name.split(":", 1)[1]) for name, x in v.items() if name.startswith("coda:")]
        best = max(fixed) if fixed else None
        ratio = coda["tflops"] / cub["tflops"] if coda and cub and cub["tflops"] > 0 else None
        if ratio is not None:
            ratios.append(ratio)
        out.append("| %s | %s | %s | %d | %d | %d | %s | %s | %s | %s | %s | %s |" % (
            cfg, op, ps, m, n, k, dd,
            "%.1f" % cub["tflops"] if cub else "-",
            "%.1f" % coda["tflops"] if coda else "-",
            "**%.3f**" % ratio if ratio is not None and ratio < 0.92 else ("%.3f" % ratio if ratio is not None else "-"),
            coda.get("winner", "") if coda else "-",
            "%s (%.1f)" % (best[1], best[0]) if best else "-"))
    summary = []
    if ratios:
        gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        summary.append("CODA autotuned plain GEMM vs cuBLAS over %d shapes: geometric mean **%.3f**, min **%.3f**, "
                       "%d shapes below 0.92." % (len(ratios), gm, min(ratios), sum(1 for x in ratios if x < 0.92)))
    return out, summary


def gmean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def fused_table(rows):
    shapes = OrderedDict()
    for r in rows:
        if r.get("suite") != "fused":
            continue
        key = (r["config"], r["op"], r["M"], r["N"], r["K"])
        shapes.setdefault(key, {})[r["variant"]] = r
    out = ["| config | op | M | N | K | cuBLAS GEMM ms | CODA ms | unfused ms | CODA/cuBLAS | unfused/CODA | peak GiB CODA / unfused |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    vs_cublas, vs_unfused = [], []
    for key, v in shapes.items():
        cfg, op, m, n, k = key
        cub, coda, unf = v.get("cublas"), v.get("coda"), v.get("unfused")
        if not (cub and coda and unf):
            continue
        rc, ru = coda["ms"] / cub["ms"], unf["ms"] / coda["ms"]
        if coda.get("fused_op") != "linear_rowscale":
            vs_cublas.append(rc)
            vs_unfused.append(ru)
        out.append("| %s | %s | %d | %d | %d | %.4f | %.4f | %.4f | %s | %.3f | %.2f / %.2f |" % (
            cfg, op, m, n, k, cub["ms"], coda["ms"], unf["ms"], ("**%.3f**" % rc) if rc > 1.05 else "%.3f" % rc, ru,
            coda.get("peak_gib", 0), unf.get("peak_gib", 0)))
    summary = []
    if vs_cublas:
        summary.append("Fused ops at their own GEMMs (linear_rowscale rows excluded) over %d shapes: CODA/cuBLAS-GEMM "
                       "time geometric mean **%.3f**, max %.3f, %d shapes above 1.05; unfused/CODA speedup geometric "
                       "mean %.3f (min %.3f, max %.3f)." % (len(vs_cublas), gmean(vs_cublas), max(vs_cublas),
                                                 sum(1 for x in vs_cublas if x > 1.05), gmean(vs_unfused),
                                                 min(vs_unfused), max(vs_unfused)))
    return out, summary


def backward_table(rows):
    """bench_backward: fused backward ops (pass bwd) vs cuBLAS dgrad and unfused; LM head memory (pass fwd)."""
    shapes = OrderedDict()
    for r in rows:
        if r.get("suite") != "backward":
            continue
        key = (r["config"], r["op"], r["pass"], r["M"], r["N"], r["K"])
        shapes.setdefault(key, {})[r["variant"]] = r
    ops = ["| config | op | M | N | K | cuBLAS dgrad ms | CODA ms | unfused ms | CODA/cuBLAS | unfused/CODA |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    head = ["| config | M | V | d | CODA ms | materialized ms | CODA peak MiB (allocated) | materialized peak MiB "
            "(allocated) | materialized/CODA memory |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    vs_cublas, vs_unfused = [], []
    for key, v in shapes.items():
        cfg, op, pas, m, n, k = key
        if pas == "fwd":
            coda, mat = v.get("coda"), v.get("materialized")
            if coda and mat:
                head.append("| %s | %d | %d | %d | %.3f | %.3f | %.1f (%.1f) | %.1f (%.1f) | %.1f |" % (
                    cfg, m, n, k, coda["ms"], mat["ms"], coda["peak_measured_mib"], coda["alloc_mib"],
                    mat["peak_measured_mib"], mat["alloc_mib"], mat["peak_measured_mib"] / coda["peak_measured_mib"]))
            continue
        cub, coda, unf = v.get("cublas"), v.get("coda"), v.get("unfused")
        if not (cub and coda and unf):
            continue
        rc, ru = coda["ms"] / cub["ms"], unf["ms"] / coda["ms"]
        vs_cublas.append(rc)
        vs_unfused.append(ru)
        ops.append("| %s | %s | %d | %d | %d | %.4f | %.4f | %.4f | %s | %s |" % (
            cfg, op, m, n, k, cub["ms"], coda["ms"], unf["ms"], ("**%.3f**" % rc) if rc > 1.08 else "%.3f" % rc,
            ("**%.3f**" % ru) if ru < 1.5 else "%.3f" % ru))
    summary = []
    if vs_cublas:
        summary.append("Fused backward ops over %d shapes: CODA/cuBLAS-dgrad time geometric mean **%.3f** (max %.3f, "
                       "%d above 1.08); unfused/CODA speedup geometric mean %.3f (min %.3f, max %.3f). Bold: outside "
                       "issue 5's targets (<= 1.08x cuBLAS, >= 1.5x unfused)." % (
                           len(vs_cublas), gmean(vs_cublas), max(vs_cublas), sum(1 for x in vs_cublas if x > 1.08),
                           gmean(vs_unfused), min(vs_unfused), max(vs_unfused)))
    return ops, head, summary


def block_table(rows):
    """bench_block: the block's forward, backward (= f+b - fwd) and forward+backward vs its GEMMs via cuBLAS."""
    shapes = OrderedDict()
    for r in rows:
        if r.get("suite") != "block":
            continue
        shapes.setdefault((r["config"], r["M"]), {})[(r["pass"], r["variant"])] = r
    out = ["| config | M | cuBLAS GEMMs fwd ms | CODA fwd ms | ratio | cuBLAS bwd ms | CODA bwd ms | ratio | "
           "cuBLAS f+b ms | CODA f+b ms | ratio | not stored by CODA (GiB) |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (cfg, m), v in shapes.items():
        cf, kf = v.get(("fwd", "cublas_gemms")), v.get(("fwd", "coda"))
        cfb, kfb = v.get(("fwd+bwd", "cublas_gemms")), v.get(("fwd+bwd", "coda"))
        if not (cf and kf and cfb and kfb):
            continue
        cb, kb = cfb["ms"] - cf["ms"], kfb["ms"] - kf["ms"]
        out.append("| %s | %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %s | %.2f |" % (
            cfg, m, cf["ms"], kf["ms"], kf["ms"] / cf["ms"], cb, kb, kb / cb, cfb["ms"], kfb["ms"],
            ("**%.3f**" % (kfb["ms"] / cfb["ms"])) if kfb["ms"] / cfb["ms"] > 1.05 else "%.3f" % (kfb["ms"] / cfb["ms"]),
            kf.get("not_stored_gib", 0)))
    return out


def lm_head_table(rows):
    """bench_lm_head: LM head + CE + final-norm forward+backward, CODA chunked vs materialized logits."""
    shapes = OrderedDict()
    for r in rows:
        if r.get("suite") != "lm_head":
            continue
        shapes.setdefault((r["config"], r["M"], r["N"], r["K"]), {})[r["variant"]] = r
    out = ["| config | M | V | d | variant | ms | materialized/variant time | peak MiB | materialized/variant memory |",
           "|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for (cfg, m, v, d), x in shapes.items():
        mat = x.get("materialized")
        if not mat:
            continue
        for name in ("coda", "coda_onepass", "materialized"):
            c = x.get(name)
            if c:
                out.append("| %s | %d | %d | %d | %s | %.3f | %.3f | %.1f | %.2f |" % (
                    cfg, m, v, d, name, c["ms"], mat["ms"] / c["ms"], c["peak_measured_mib"],
                    mat["peak_measured_mib"] / c["peak_measured_mib"]))
    return out


def sweep_table(rows, suite, defaults):
    """Best pin per shape of a sweep suite (fused_sweep, backward_sweep) next to the given pins' ratios."""
    shapes = OrderedDict()
    for r in rows:
        if r.get("suite") != suite:
            continue
        shapes.setdefault((r["config"], r["op"], r["M"], r["N"], r["K"]), []).append(r)
    out = ["| config | op | M | N | K | best pin | best CODA/cuBLAS | %s |" % " | ".join(d for d in defaults),
           "|---|---|---:|---:|---:|---|---:|%s" % ("---:|" * len(defaults))]
    for key, rs in shapes.items():
        best = min(rs, key=lambda r: r["time_vs_cublas"])
        by = {r["pin"]: r["time_vs_cublas"] for r in rs}
        out.append("| %s | %s | %d | %d | %d | %s | %.3f | %s |" % (
            key + (best["pin"], best["time_vs_cublas"],
                   " | ".join("%.3f" % by[d] if d in by else "-" for d in defaults))))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("-o", "--output")
    a = ap.parse_args()
    rows = load(a.inputs)
    lines = []
    meta = rows[0] if rows else {}
    lines.append("# Benchmark summary")
    lines.append("")
    lines.append("GPU: %s; commit %s; date %s. Generated by bench/summarize.py from %s." % (
        meta.get("gpu", "?"), meta.get("commit", "?"), meta.get("date", "?"), ", ".join(a.inputs)))
    lines.append("")
    table, summary = gemm_table(rows)
    if len(table) > 2:
        lines.append("## Plain GEMM (suite gemm)")
        lines.append("")
        lines.extend(summary)
        lines.append("")
        lines.extend(table)
        lines.append("")
    table, summary = fused_table(rows)
    if len(table) > 2:
        lines.append("## Fused forward ops (suite fused)")
        lines.append("")
        lines.extend(summary)
        lines.append("")
        lines.extend(table)
        lines.append("")
    table, head, summary = backward_table(rows)
    if len(table) > 2:
        lines.append("## Fused backward ops (suite backward)")
        lines.append("")
        lines.extend(summary)
        lines.append("")
        lines.extend(table)
        lines.append("")
    if len(head) > 2:
        lines.append("## LM head + cross-entropy forward: time and measured peak device memory (suite backward, lm_head)")
        lines.append("")
        lines.extend(head)
        lines.append("")
    table = block_table(rows)
    if len(table) > 2:
        lines.append("## The block, forward and backward (suite block)")
        lines.append("")
        lines.append("Backward = (forward+backward) - forward, both measured. Bold: above issue 5's 1.05x.")
        lines.append("")
        lines.extend(table)
        lines.append("")
    table = lm_head_table(rows)
    if len(table) > 2:
        lines.append("## LM head + cross-entropy + final norm, forward+backward (suite lm_head)")
        lines.append("")
        lines.extend(table)
        lines.append("")
    table = sweep_table(rows, "fused_sweep", ["coop_128x256x64_c2x1", "pp_128x128x64_c2x1"])
    if len(table) > 2:
        lines.append("## Config x knob sweep (suite fused_sweep)")
        lines.append("")
        lines.extend(table)
        lines.append("")
    table = sweep_table(rows, "backward_sweep", ["pp_128x128x64_c2x1:raster=n,swizzle=8",
                                                 "pp_128x128x64_c2x1:raster=n,swizzle=1"])
    if len(table) > 2:
        lines.append("## Knob sweep of the backward ops (suite backward_sweep; CODA/cuBLAS within one sweep; the "
                     "default since 23da9d2 is raster=n,swizzle=8)")
        lines.append("")
        lines.extend(table)
        lines.append("")
    text = "\n".join(lines) + "\n"
    if a.output:
        with open(a.output, "w") as f:
            f.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
