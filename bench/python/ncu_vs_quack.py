"""Nsight Compute target: CODA's and quack's kernels of one vs_quack.py case, one call each inside the NVTX range
"measure" (first calls, compiles, autotuning and warm-up run before it), so ncu profiles just the calls to compare.

    source .whl/quack-b/quack-env   # quack on PYTHONPATH (../shared/tools/stage-quack)
    ncu --clock-control none --nvtx --nvtx-include "measure/" --set full -o rep \\
        python bench/python/ncu_vs_quack.py --op gemm_gu --config llama3-1B \\
            --impls "coda:pp_128x192x64_c2x1;quack:pp_128x192_c2x1"

--impls names contenders as vs_quack.py builds them, separated by ';' (a pin's knobs hold commas): `coda`,
`cublas_gemm`, `quack_default`, `coda:<pin>` and `coda_rowscale:<pin>` (a --coda-pins entry: a config with its
knobs, or CODA_*=VALUE) and `quack:<label>` (quack's call with that config pinned).
"""
from __future__ import annotations

import argparse

import torch
import vs_quack
from common import CONFIGS


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", default="gemm_gu", choices=vs_quack.OPS)
    p.add_argument("--config", default="llama3-1B", choices=vs_quack.MODEL_CONFIGS)
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--impls", default="coda:pp_128x192x64_c2x1;quack:pp_128x192_c2x1",
                   help="contenders separated by ';'")
    p.add_argument("--warmup", type=int, default=5, help="calls of each contender before the profiled one")
    a = p.parse_args(argv)
    impls = [s.strip() for s in a.impls.split(";") if s.strip()]
    pins = list(dict.fromkeys(s.split(":", 1)[1] for s in impls if s.startswith(("coda:", "coda_rowscale:"))))
    labels = [s.split(":", 1)[1] for s in impls if s.startswith("quack:")]
    quack = None
    if labels or any(s.startswith("quack") for s in impls):
        quack, why = vs_quack.load_quack()
        if quack is None:
            raise SystemExit(f"ncu_vs_quack: quack is not importable ({why}); source quack-env first")
    case = vs_quack.build_case(a.op, CONFIGS[a.config.lower()], a.tokens, quack, quack_configs=labels,
                               coda_pins=pins)
    calls = {}
    for s in impls:
        if s.startswith("quack:"):
            fn = (case.pinned or {}).get(s.split(":", 1)[1])
        else:
            fn = case.fns.get(s)
        if fn is None:
            raise SystemExit(f"ncu_vs_quack: {a.op} has no contender {s!r} (has {', '.join(case.fns)})")
        calls[s] = fn
    for fn in calls.values():
        for _ in range(a.warmup):
            fn()
    torch.cuda.synchronize()
    for s, fn in calls.items():
        torch.cuda.nvtx.range_push("measure")
        fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        print("profiled", s, flush=True)


if __name__ == "__main__":
    main()
