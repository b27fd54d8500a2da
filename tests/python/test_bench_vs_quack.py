"""bench/python/vs_quack.py (CODA vs quack vs cuBLAS, issue 23) on the CPU: argument parsing, the plan's GPU-time
estimate, quack's config labels, the cache-key wrapper on a stand-in module tree, one case run end to end with
stand-in contenders (first calls, output checks, the config screen, warm-up, rounds in rotating order, failures
kept as rows), the row schema and the table. The GPU parts (CODA's and quack's kernels) run on the H200 only."""
import dataclasses
import json
import importlib.util
import math
import sys
import types
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "python"))

import vs_quack  # noqa: E402

FAST = vs_quack.Timing(warm_s=0.005, rounds=3, timing_s=0.001, screen_warm_s=0.001, screen_s=0.001,
                       screen_rounds=2, min_reps=1)


def test_parse_args_defaults_and_normalisation():
    a = vs_quack.parse_args([])
    assert a.configs == ["llama3-1B", "llama3-8B", "llama3-70B"] and a.tokens == [8192]
    assert a.ops == list(vs_quack.OPS) and a.quack and a.out is None and not a.quick
    assert a.quack_configs == list(vs_quack.QUACK_CONFIGS) and a.timing == vs_quack.Timing()
    a = vs_quack.parse_args(["--configs", "LLAMA3-8b,llama3-8B", "--tokens", "8192,16384,8192", "--ops",
                             "linear_rowscale_swiglu,linear_swiglu_bwd_zdz", "--quick", "--no-quack", "--out", "/tmp/x",
                             "--rounds", "5", "--quack-configs", "pp_128x128_c1x2,coop_256x128_c2x1"])
    assert a.configs == ["llama3-8B"] and a.tokens == [8192, 16384] and not a.quack
    assert a.ops == ["linear_rowscale_swiglu", "linear_swiglu_bwd_zdz"]
    assert a.out == Path("/tmp/x") and a.quack_configs == ["pp_128x128_c1x2", "coop_256x128_c2x1"]
    assert a.timing == dataclasses.replace(vs_quack.Timing.quick(), rounds=5)
    a = vs_quack.parse_args(["--warm-s", "3", "--timing-ms", "200"])
    assert a.timing == dataclasses.replace(vs_quack.Timing(), warm_s=3.0, timing_s=0.2)


@pytest.mark.parametrize("args, says", [
    (["--configs", "llama3-3B"], "unknown model config"),
    (["--tokens", "8192,abc"], "expected integers"),
    (["--tokens", "1000"], "multiple of 128"),
    (["--ops", "linear_rowscale_swiglu,no_such_op"], "unknown no_such_op"),
    (["--quack-configs", "pp_128x192"], "expected pp_MxN_cAxB"),
    (["--rounds", "0"], "--rounds must be >= 1"),
])
def test_parse_args_refuses_bad_values(args, says, capsys):
    with pytest.raises(SystemExit) as e:
        vs_quack.parse_args(args)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_quack_config_labels():
    assert vs_quack.parse_quack_config("pp_128x192_c2x1") == dict(tile_m=128, tile_n=192, pingpong=True,
                                                                  cluster_m=2, cluster_n=1)
    assert vs_quack.parse_quack_config("coop_256x128_c1x2") == dict(tile_m=256, tile_n=128, pingpong=False,
                                                                    cluster_m=1, cluster_n=2)
    assert vs_quack.QUACK_DEFAULT in vs_quack.QUACK_CONFIGS and len(set(vs_quack.QUACK_CONFIGS)) == 7
    for label in vs_quack.QUACK_CONFIGS:
        vs_quack.parse_quack_config(label)


def test_contenders_shapes_and_estimate():
    assert vs_quack.contenders("linear_rowscale_swiglu") == ["cublas_gemm", "coda", "quack_default", "quack_best",
                                                             "quack_norm_act"]
    assert vs_quack.contenders("rmsnorm") == ["coda", "quack"]
    assert vs_quack.contenders("linear_residual_rmsnorm_bwd", False) == ["cublas_gemm", "coda"]
    cfg = vs_quack.CONFIGS["llama3-8b"]
    assert vs_quack.op_shape("linear_rowscale_swiglu", cfg, 8192) == (8192, 2 * 14336, 4096)
    assert vs_quack.op_shape("linear_swiglu_bwd_zdz", cfg, 8192) == (8192, 14336, 4096)
    assert vs_quack.op_shape("linear_residual_rmsnorm_bwd", cfg, 8192) == (8192, 4096, 2 * 14336)
    assert vs_quack.work("lm_head", (8, 16, 4)) == {"flop": 3 * 2 * 8 * 16 * 4}
    t = vs_quack.Timing()
    one = vs_quack.estimate_seconds(vs_quack.OPS, vs_quack.MODEL_CONFIGS, [8192], t)
    two = vs_quack.estimate_seconds(vs_quack.OPS, vs_quack.MODEL_CONFIGS, [8192, 16384], t)
    # the default (8192 tokens) fits the ~8 minutes the issue allows; both token counts do not (one call each)
    assert 120 < one < 8 * 60 < two
    assert vs_quack.estimate_seconds(vs_quack.OPS, vs_quack.MODEL_CONFIGS, [8192], t, quack=False) < one / 1.5
    # a warm-up per contender per (op, config, tokens): 30 contenders x 3 configs x 2 s at least
    assert one > 30 * 3 * t.warm_s


def test_patch_quack_cache_key_on_stand_in_modules():
    """The wrapper goes into identity and every quack module that imported it by name; a value without a key gets a
    constant key of its type, other TypeErrors still raise, and a second call changes nothing."""
    class Opaque:
        pass

    ident = types.ModuleType("quack.gemm_runtime.identity")

    def semantic_value_key(value, seen):
        if isinstance(value, tuple):
            return ("tuple", tuple(ident.semantic_value_key(v, seen) for v in value))  # recursion by global name
        if isinstance(value, Opaque):
            raise TypeError(f"epilogue fn depends on {value!r}, which has no fail-closed semantic key. ...")
        if value == "bad":
            raise TypeError("something else")
        return value
    ident.semantic_value_key = semantic_value_key
    frontend = types.ModuleType("quack.operand_transform.frontend")
    frontend._semantic_value_key = semantic_value_key
    other = types.ModuleType("unrelated")
    other.semantic_value_key = semantic_value_key
    modules = {"quack.gemm_runtime.identity": ident, "quack.operand_transform.frontend": frontend,
               "unrelated": other, "quack.empty": None}
    with pytest.raises(TypeError):
        ident.semantic_value_key((1, Opaque()), set())
    assert vs_quack.patch_quack_cache_key(modules) == 2
    wrapped = ident.semantic_value_key
    assert wrapped is not semantic_value_key and frontend._semantic_value_key is wrapped
    assert other.semantic_value_key is semantic_value_key  # not quack's
    key = wrapped((1, Opaque()), set())
    assert key[0] == "tuple" and key[1][0] == 1 and key[1][1][0] == "coda-bench-unkeyed"
    assert key[1][1][2].endswith("Opaque")
    with pytest.raises(TypeError, match="something else"):
        wrapped("bad", set())
    assert vs_quack.patch_quack_cache_key(modules) == 2 and ident.semantic_value_key is wrapped
    # no such module: nothing happens
    assert vs_quack.patch_quack_cache_key({}) == 0
    assert vs_quack.patch_quack_cache_key({"quack": types.ModuleType("quack")}) == 0


def test_max_rel_err_and_agreement():
    b = torch.tensor([[1.0, -4.0], [2.0, 0.5]])
    assert vs_quack.max_rel_err(b, b) == 0.0
    assert vs_quack.max_rel_err(b + 0.04, b, rows=1) == pytest.approx(0.01)
    assert vs_quack.max_rel_err(b.T, b[:1]) == math.inf
    assert vs_quack.max_rel_err(torch.tensor([float("nan"), 1.0]), torch.tensor([1.0, 1.0])) == math.inf
    assert vs_quack.max_rel_err(torch.tensor(2.0), torch.tensor(2.0)) == 0.0  # a loss: 0-d
    ok, worst, errs = vs_quack.agreement({"y": b + 0.04, "z": b}, {"y": b, "z": b}, vs_quack.same("y", "z"), 0.02)
    assert ok and worst == pytest.approx(0.01) and errs["z"] == 0.0
    ok, worst, errs = vs_quack.agreement({"y": b}, {"y": b}, vs_quack.same("y", "missing"), 0.02)
    assert not ok and errs["missing"] == math.inf


def _stand_in_case(log, failing=()):
    """Four contenders on the CPU: cublas_gemm (the reference), coda, quack_default (wrong outputs) and a quack
    contender that fails at its first call; four pinned configs: a slow one, the fastest right one, one that fails
    and a fast one with wrong outputs."""
    ref = torch.arange(12.0).reshape(3, 4)

    def fn(name, out, cost=0.0, fail=False):
        def call():
            log.append(name)
            if fail:
                raise TypeError(f"{name} rejected")
            if cost:
                end = time.perf_counter() + cost
                while time.perf_counter() < end:
                    pass
            return {"y": out}
        return call
    import time
    fns = {"cublas_gemm": fn("cublas_gemm", ref), "coda": fn("coda", ref + 0.01),
           "quack_default": fn("quack_default", ref * 2), "quack_rms": fn("quack_rms", ref, fail=True)}
    checks = {"coda": ("cublas_gemm", vs_quack.same("y")), "quack_default": ("cublas_gemm", vs_quack.same("y")),
              "quack_best": ("cublas_gemm", vs_quack.same("y")), "quack_rms": ("cublas_gemm", vs_quack.same("y"))}
    pinned = {"pp_128x192_c2x1": fn("pp_slow", ref, cost=2e-3), "pp_128x128_c1x2": fn("pp_fast", ref),
              "coop_256x128_c2x1": fn("coop", ref, fail=True), "pp_192x128_c1x2": fn("pp_wrong", -ref)}
    return vs_quack.Case("gemm_gu", (3, 4, 5), fns, checks, pinned, {"quack_default": "default"})


def test_run_case_checks_screens_and_takes_turns():
    log = []
    case = _stand_in_case(log)
    res, screen = vs_quack.run_case(case, FAST, tol=0.03, device="cpu")
    assert list(res) == ["cublas_gemm", "coda", "quack_default", "quack_rms", "quack_best"]
    assert res["coda"]["agrees"] is True and res["coda"]["max_rel_err"] < 0.03
    assert res["quack_default"]["agrees"] is False  # twice the reference: not the same computation
    assert res["quack_rms"] == {"error": "TypeError: quack_rms rejected"}
    assert "agrees" not in res["cublas_gemm"] and res["cublas_gemm"]["rounds"] == FAST.rounds
    # the screen: one row per pinned config, the failing one with its error, the fastest picked as quack_best
    assert [s["quack_config"] for s in screen] == ["pp_128x192_c2x1", "pp_128x128_c1x2", "coop_256x128_c2x1",
                                                   "pp_192x128_c1x2"]
    assert screen[2]["error"] == "TypeError: coop rejected" and screen[0]["ms"] > screen[1]["ms"]
    assert screen[3]["agrees"] is False and screen[3]["ms"] > 0  # timed, but never picked: not the same outputs
    assert case.labels["quack_best"] == "pp_128x128_c1x2" and res["quack_best"]["agrees"] is True
    assert res["quack_best"]["screen_ms"] == screen[1]["ms"] and res["quack_best"]["rounds"] == FAST.rounds
    for impl in ("cublas_gemm", "coda", "quack_default", "quack_best"):
        assert res[impl]["ms"] > 0 and res[impl]["reps"] >= 1 and res[impl]["warm_ms_per_call"] > 0
    # call order: first calls (references first), the screen, each contender's warm-up, then the rounds with the
    # order rotated by one per round (runs of one contender's back-to-back calls collapsed to one entry)
    runs = [n for i, n in enumerate(log) if i == 0 or log[i - 1] != n]
    assert runs[:4] == ["cublas_gemm", "coda", "quack_default", "quack_rms"]
    order = ["cublas_gemm", "coda", "quack_default", "pp_fast"]  # quack_best is the pinned pp_fast call
    rounds = [order[(r + j) % 4] for r in range(FAST.rounds) for j in range(4)]
    assert runs[-len(rounds):] == rounds
    assert runs[-len(rounds) - 4:-len(rounds)] == order  # the warm-ups, in the same order, just before


def test_run_case_reports_a_reference_failure_and_no_screen_without_pins():
    log = []
    case = _stand_in_case(log)
    case.pinned = None
    case.fns["cublas_gemm"] = lambda: (_ for _ in ()).throw(RuntimeError("CUDA error: out of memory"))
    del case.fns["quack_rms"]
    res, screen = vs_quack.run_case(case, FAST, tol=0.03, device="cpu")
    assert screen == [] and "quack_best" not in res
    assert res["cublas_gemm"] == {"error": "RuntimeError: CUDA error: out of memory"}
    assert res["coda"]["agrees"] is None and res["coda"]["ms"] > 0  # nothing to compare with, still timed


def test_rows_schema_and_table(tmp_path):
    log = []
    case = _stand_in_case(log)
    res, screen = vs_quack.run_case(case, FAST, tol=0.03, device="cpu")
    rows = [vs_quack.make_row("gemm_gu", "llama3-1B", case.shape, impl, r, "abc1234", "cpu", "2026-12-03",
                              quack_config=case.labels.get(impl)) for impl, r in res.items()]
    rows += [vs_quack.make_row("gemm_gu", "llama3-1B", case.shape, "quack_screen",
                               {k: v for k, v in s.items() if k != "quack_config"}, "abc1234", "cpu", "2026-12-03",
                               quack_config=s["quack_config"], screen=True) for s in screen]
    rows.append(vs_quack.make_row("rmsnorm", "llama3-1B", (8, 16, None), "quack", {"ms": 0.5, "max_rel_err":
                                  float("inf"), "agrees": False}, "abc1234", "cpu", "2026-12-03"))
    for r in rows:
        for k in vs_quack.REQUIRED_FIELDS:
            assert k in r, (k, r)
        assert r["suite"] == "vs_quack" and r["tokens"] == r["M"] and r["variant"] == r["impl"]
        json.loads(json.dumps(r, allow_nan=False))  # strict JSON: no inf / nan numbers
    by = {(r["impl"], r.get("quack_config")): r for r in rows}
    assert by[("quack_best", "pp_128x128_c1x2")]["tflops"] == pytest.approx(
        2 * 3 * 4 * 5 / (by[("quack_best", "pp_128x128_c1x2")]["ms"] * 1e9))
    assert by[("quack_rms", None)]["error"].startswith("TypeError") and by[("quack_rms", None)]["ms"] is None
    assert by[("quack", None)]["gb_s"] > 0 and by[("quack", None)]["max_rel_err"] == "inf"
    assert by[("quack_screen", "coop_256x128_c2x1")]["screen"] is True
    assert by[("cublas_gemm", None)]["pass"] == "fwd" and by[("cublas_gemm", None)]["K"] == 5
    vs_quack.append_jsonl(tmp_path / "r.jsonl", rows)
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == len(rows)
    table = vs_quack.markdown_table(rows)
    lines = table.splitlines()
    assert lines[0].startswith("| op | config | tokens | cuBLAS ms | CODA ms (/ cuBLAS) | quack default ms")
    assert len(lines) == 4  # header, rule, gemm_gu, rmsnorm (the screen rows are not in the table)
    g = {r["impl"]: r for r in rows if r["op"] == "gemm_gu" and not r.get("screen")}
    cells = [c.strip() for c in lines[2].split("|")[1:-1]]
    cb = g["cublas_gemm"]["ms"]
    assert cells[:4] == ["gemm_gu", "llama3-1B", "3", f"{cb:.3f}"]
    assert cells[4] == f"{g['coda']['ms']:.3f} ({g['coda']['ms'] / cb:.3f})"
    assert cells[5] == f"{g['quack_default']['ms']:.3f} ({g['quack_default']['ms'] / cb:.3f})"
    assert cells[6] == f"{g['quack_best']['ms']:.3f} ({g['quack_best']['ms'] / cb:.3f})"
    assert cells[7] == "pp_128x128_c1x2" and cells[8] == f"{g['coda']['ms'] / g['quack_best']['ms']:.3f}"
    assert cells[9] == "quack_rms error" and cells[10] == "no: quack_default; errors: quack_rms"
    last = [c.strip() for c in lines[3].split("|")[1:-1]]
    assert last[0] == "rmsnorm" and last[3] == "-" and last[6] == "0.500" and last[7] == "-"
    assert last[10] == "no: quack"
    text = vs_quack.readme(rows, dict(command="vs_quack.py --out x", estimate_s=10.0, wall_s=12.0))
    assert table in text and "quack_rms: TypeError: quack_rms rejected" in text and "Planned GPU time 10 s" in text
    assert "commit abc1234; cpu;" in text and f"then {FAST.rounds} rounds" in text  # the screen's rounds left out
    assert "coop_256x128_c2x1, pp_128x128_c1x2, pp_128x192_c2x1, pp_192x128_c1x2 in a short screen" in text
    # --report: the README again from the folder's JSON lines, another call's rows appended: a group comes from the
    # latest run that measured it, whole, so a later CODA-only run shows no cuBLAS ratio from the earlier run
    later = dict(rows[1], ms=7.0, date="2026-12-04")
    assert later["impl"] == "coda"
    vs_quack.append_jsonl(tmp_path / "vs_quack.jsonl", rows + [later])
    assert vs_quack.main(["--report", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "README.md").read_text()
    assert "2026-12-03, 2026-12-04; commit abc1234" in text and "| - | 7.000 |" in text
    assert f"({7.0 / cb:.3f})" not in text
    # a later run of the same group that only failed does not hide the measurement
    failed = {k: v for k, v in later.items() if k != "ms"}
    failed.update(date="2026-12-05", error="RuntimeError: skipped")
    vs_quack.append_jsonl(tmp_path / "vs_quack.jsonl", [failed])
    assert vs_quack.main(["--report", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "README.md").read_text()
    assert "| - | 7.000 |" in text and "RuntimeError: skipped" not in text
    assert vs_quack.read_rows(tmp_path / "missing.jsonl") == []


def test_estimate_mode_runs_without_a_gpu():
    import subprocess
    script = Path(__file__).resolve().parents[2] / "bench" / "python" / "vs_quack.py"
    r = subprocess.run([sys.executable, str(script), "--estimate", "--tokens", "8192,16384"], capture_output=True,
                       text=True, cwd=script.parent, timeout=120)
    assert r.returncode == 0 and "planned GPU time" in r.stdout, r.stderr[-500:]


class TorchQuack:
    """quack's calls as vs_quack.QuackOps makes them, written in torch after quack 0.6.5's *_ref functions and
    docstrings (gemm: D = A B with B (K, N); gated activations pair columns (2i, 2i+1) as (gate, up); gemm_rms:
    out = (A B + C) gamma, premult_out = A B + C, rstd; gemm_norm_act: preact = (A B) rstd; rmsnorm_bwd adds
    dresidual_out into dx): the wiring of build_case checked on the CPU against CODA's float64 reference."""
    version = "torch stand-in"

    @staticmethod
    def _mm(A, B):
        return A.float() @ B.float()

    def gemm(self, A, B, out, label=None):
        return out.copy_(self._mm(A, B))

    def gemm_add(self, A, B, C, out, label=None):
        return out.copy_(self._mm(A, B) + C.float())

    def gemm_act(self, A, B, pre, post, label=None):
        p = self._mm(A, B)
        return pre.copy_(p), post.copy_(torch.nn.functional.silu(p[:, ::2]) * p[:, 1::2])

    def gemm_dact(self, A, B, preact, dx, post, label=None):
        dout, g, u = self._mm(A, B), preact[:, ::2].float(), preact[:, 1::2].float()
        s = torch.sigmoid(g)
        dg, du = dout * u * s * (1 + g * (1 - s)), dout * g * s
        return dx.copy_(torch.stack([dg, du], -1).reshape(dx.shape)), post.copy_(g * s * u)

    def qk_rope(self, A, B, cs, head_dim, w, out, label=None):
        p = self._mm(A, B).unflatten(-1, (-1, head_dim))  # every head, v too (qk_rope_epi's HeadRstd, eps 1e-6)
        x = (p * torch.rsqrt(p.square().mean(-1, keepdim=True) + 1e-6)).flatten(-2) * w.float()
        x1, x2 = x[:, 0::2], x[:, 1::2]
        c, s = cs.float()[:, 0::2].repeat(1, x1.shape[1] // cs.shape[1] * 2), cs.float()[:, 1::2].repeat(
            1, x1.shape[1] // cs.shape[1] * 2)
        return out.copy_(torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), -1).flatten(-2))

    def gemm_rms(self, A, B, C, gamma, out, premult, eps):
        D = self._mm(A, B) + C.float()
        premult.copy_(D)
        return out.copy_(D * gamma.float()), torch.rsqrt(D.square().mean(-1) + eps)

    def gemm_norm_act(self, A, B, rstd, pre, post):
        p = self._mm(A, B) * rstd[:, None]
        return pre.copy_(p), post.copy_(torch.nn.functional.silu(p[:, ::2]) * p[:, 1::2])

    def rmsnorm_fwd(self, x, w, eps):
        rstd = torch.rsqrt(x.float().square().mean(-1) + eps)
        return (x.float() * rstd[:, None] * w.float()).to(x.dtype), rstd

    def rmsnorm_bwd(self, x, w, dout, rstd, dresidual):
        xh, wdy = x.float() * rstd[:, None], dout.float() * w.float()
        dx = rstd[:, None] * (wdy - xh * (xh * wdy).mean(-1, keepdim=True)) + dresidual.float()
        return dx.to(x.dtype), (dout.float() * xh).sum(0).to(w.dtype)

    def rmsnorm(self, x, w, eps):
        xf = x.float()
        return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)

    def lce(self, n, w, t, chunk_size=4096):
        return torch.nn.functional.cross_entropy((n @ w.t()).float(), t)

    def lce_path(self, n, w, chunk_size=4096):
        return "torch"


def _cpu_stand_ins(monkeypatch):
    """CODA's ops through their float64 CPU reference, coda_gemm through it too, V small."""
    import bench_gemm
    from coda import _C, _kernels, _reference
    for name in ("rmsnorm_prepare", "linear_residual_rmsnorm", "linear_rowscale_swiglu", "linear_swiglu_bwd_zdz",
                 "linear_residual_rmsnorm_bwd", "linear_rowscale_qk_norm_rope", "linear_rowscale_rope",
                 "linear_rowscale"):
        monkeypatch.setattr(_kernels, name, getattr(_reference, name))
    monkeypatch.setattr(_C, "stream", lambda device: None)

    def coda_gemm_call(A, B, D, dev, stream):
        return lambda: D.copy_(_reference.linear_rowscale(A, B, torch.ones(A.shape[0])))
    monkeypatch.setattr(bench_gemm, "coda_gemm_call", coda_gemm_call)
    monkeypatch.setattr(vs_quack, "VOCAB", 1024)  # the LM head's V: small on the CPU


@pytest.mark.parametrize("op", vs_quack.OPS)
def test_build_case_wiring_against_codas_reference(op, monkeypatch):
    """Every op's case on the CPU: CODA's ops through their float64 reference (coda._reference), quack through the
    torch stand-in above, cuBLAS through torch.mm; every checked output agrees, so the layouts (interleaved gate/up,
    B as w.t()), linear_residual_rmsnorm_bwd's zdz and the rmsnorm comparison (quack's x_hat gamma against CODA's h
    rstd) are wired right."""
    _cpu_stand_ins(monkeypatch)
    pins = ["pp_128x192_c2x1", "coop_256x128_c2x1"]
    case = vs_quack.build_case(op, vs_quack.CONFIGS["tiny"], 128, TorchQuack(), pins, device="cpu")
    assert list(case.fns) == [i for i in vs_quack.contenders(op) if i != "quack_best"]
    assert (case.pinned is not None) == (op in vs_quack.SCREENED_OPS)
    res, screen = vs_quack.run_case(case, FAST, tol=0.03, device="cpu")
    assert set(res) == set(vs_quack.contenders(op))
    if op == "block" and importlib.util.find_spec("liger_kernel") is None:  # the one contender allowed to fail
        assert res.pop("liger")["error"].startswith("ModuleNotFoundError")
    for impl, r in res.items():
        assert "error" not in r, (impl, r)
        assert r["ms"] > 0 and r["rounds"] == FAST.rounds
        if impl in case.checks:
            assert r["agrees"] is True, (impl, r)
    assert [s["quack_config"] for s in screen] == (pins if op in vs_quack.SCREENED_OPS else [])
    assert all(s["agrees"] for s in screen)


def test_warm_for_and_nvml_sampler_on_the_cpu(monkeypatch):
    """common.warm_for calls back to back for the time asked; common.NvmlSampler gives {} without a GPU, and with
    a (stand-in) pynvml samples clock and power from a thread while the block runs, once at each end too."""
    import time

    import common
    calls = []
    ms = common.warm_for(lambda: calls.append(time.sleep(0.002)), 0.05, device="cpu")
    assert len(calls) >= 5 and 2.0 <= ms < 50 and abs(ms * len(calls) - 50) < 30
    assert common.warm_for(lambda: None, 0.0, device="cpu") >= 0 and common.NvmlSampler().summary() == {}
    with common.NvmlSampler() as s:  # no CUDA here: nothing sampled
        pass
    assert s.summary() == {} or torch.cuda.is_available()

    readings = iter(range(1, 10 ** 6))
    fake = types.ModuleType("pynvml")
    fake.NVML_CLOCK_SM = 1
    fake.nvmlInit = lambda: None
    fake.nvmlDeviceGetHandleByUUID = lambda key: ("handle", key)
    fake.nvmlDeviceGetClockInfo = lambda h, which: 1000 + next(readings)
    fake.nvmlDeviceGetPowerUsage = lambda h: 600000
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(common.NvmlSampler, "_handles", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: types.SimpleNamespace(uuid="1234"))
    with common.NvmlSampler(period_s=0.005) as s:
        time.sleep(0.06)
    got = s.summary()
    assert got["nvml_samples"] >= 3 and got["watts"] == 600.0 and got["watts_max"] == 600.0
    assert got["clock_min_mhz"] == 1001 and got["clock_mhz"] > 1001
    assert common.NvmlSampler._handles[0] == (fake, ("handle", "GPU-1234"))


def test_main_end_to_end_on_the_cpu(monkeypatch, tmp_path, capsys):
    """main() with the stand-ins on the CPU at the tiny shape: rows appended per op, the table printed last, the
    README written; then without quack (an error row says why) and with a deadline already passed (skipped rows)."""
    _cpu_stand_ins(monkeypatch)
    monkeypatch.setattr(vs_quack, "DEVICE", "cpu")
    monkeypatch.setitem(vs_quack.CONFIGS, "llama3-1b", vs_quack.CONFIGS["tiny"])
    stand_in = TorchQuack()
    stand_in.patched = 0
    monkeypatch.setattr(vs_quack, "load_quack", lambda: (stand_in, None))
    args = ["--configs", "llama3-1B", "--tokens", "128", "--ops",
            "linear_rowscale_swiglu,linear_residual_rmsnorm_bwd,rmsnorm", "--quick", "--warm-s", "0.001",
            "--timing-ms", "1", "--quack-configs", "pp_128x192_c2x1,pp_128x128_c1x2", "--out", str(tmp_path),
            "--commit", "abc1234"]
    assert vs_quack.main(args) == 0
    out = capsys.readouterr().out
    rows = vs_quack.read_rows(tmp_path / "vs_quack.jsonl")
    timed = [r for r in rows if not r.get("screen")]
    assert [(r["op"], r["impl"]) for r in timed] == [
        ("linear_rowscale_swiglu", i) for i in ["cublas_gemm", "coda", "quack_default", "quack_norm_act",
                                                "quack_best"]] + [
        ("linear_residual_rmsnorm_bwd", i) for i in ["cublas_gemm", "coda", "quack"]] + [
        ("rmsnorm", i) for i in ["coda", "quack"]]
    assert all("error" not in r and r["ms"] > 0 and r["commit"] == "abc1234" and r["gpu"] == "cpu" for r in timed)
    assert all(r["agrees"] for r in timed if r["impl"].startswith("quack"))
    assert [r["quack_config"] for r in rows if r.get("screen")] == ["pp_128x192_c2x1", "pp_128x128_c1x2"]
    assert out.rstrip().splitlines()[-1].startswith("wrote ") and vs_quack.markdown_table(rows) in out
    assert vs_quack.markdown_table(rows) in (tmp_path / "README.md").read_text()

    monkeypatch.setattr(vs_quack, "load_quack", lambda: (None, "ImportError: No module named 'quack'"))
    assert vs_quack.main(args[:-4] + ["--ops", "rmsnorm", "--out", str(tmp_path / "b")]) == 0
    got = {r["impl"]: r for r in vs_quack.read_rows(tmp_path / "b" / "vs_quack.jsonl")}
    assert got["coda"]["ms"] > 0 and got["quack"]["error"] == "ImportError: No module named 'quack'"

    monkeypatch.setattr(vs_quack, "load_quack", lambda: (stand_in, None))
    assert vs_quack.main(args[:-2] + ["--deadline-min", "0", "--out", str(tmp_path / "c")]) == 0
    got = vs_quack.read_rows(tmp_path / "c" / "vs_quack.jsonl")
    assert len(got) == 5 + 3 + 2 and all(r["error"].startswith("skipped: --deadline-min") for r in got)


def test_coda_over_quack_uses_the_fastest_agreeing_quack_call():
    """CODA / quack divides by the fastest quack contender computing the same op whose outputs agreed: the screen's
    quack_best can come out slower than quack_default, and a disagreeing call does not count."""
    g = {"coda": {"ms": 2.0}, "quack_default": {"ms": 1.6, "agrees": True}, "quack_best": {"ms": 1.8, "agrees": True},
         "quack_norm_act": {"ms": 1.0, "agrees": False}, "quack_rms": {"error": "TypeError"}, "coda:pin": {"ms": 0.5}}
    assert vs_quack.fastest_quack_ms(g) == 1.6
    assert vs_quack.fastest_quack_ms({"coda": {"ms": 1.0}}) is None


def test_coda_pins_name_their_variable():
    """--coda-pins: a config goes to the op's config variable; VAR=VALUE sets a CODA_* variable (CODA_PDL=1) for
    the call only."""
    import os
    assert vs_quack.pin_variable("gemm_gu", "pp_128x192x64_c2x1") == ("CODA_GEMM_CONFIG", "pp_128x192x64_c2x1")
    pin = "pp_128x128x64_c2x1:raster=n"
    assert vs_quack.pin_variable("linear_rowscale_swiglu", pin) == ("CODA_OP_CONFIG", pin)
    assert vs_quack.pin_variable("linear_residual_rmsnorm_bwd", "CODA_PDL=1") == ("CODA_PDL", "1")
    assert vs_quack.contenders("linear_rowscale_swiglu", False, ["CODA_PDL=1"]) == ["cublas_gemm", "coda",
                                                                                    "coda:CODA_PDL=1"]
    old = os.environ.pop("CODA_PDL", None)
    try:
        seen = vs_quack.with_env("CODA_PDL", "1", lambda: os.environ.get("CODA_PDL"))()
        assert seen == "1" and "CODA_PDL" not in os.environ
    finally:
        if old is not None:
            os.environ["CODA_PDL"] = old


def test_graph_ops_contenders_and_per_call_time():
    """--graph-ops: the op gains coda_graph / quack_graph contenders (CUDA-graph replays of GraphReplay.calls calls),
    whose measured time run_case divides back to one call."""
    assert vs_quack.contenders("rmsnorm", True, (), ["rmsnorm"]) == ["coda", "quack", "coda_graph", "quack_graph"]
    assert vs_quack.contenders("rmsnorm", False, (), ["rmsnorm"]) == ["coda", "coda_graph"]
    assert vs_quack.contenders("linear_residual_rmsnorm", False, (), ["rmsnorm"]) == ["cublas_gemm", "coda"]
    qk = "linear_rowscale_qk_norm_rope"  # every quack call replayed too (quack_best's after the screen picks it)
    assert vs_quack.contenders(qk, True, (), [qk])[-5:] == ["quack_default", "quack_best", "coda_graph",
                                                            "quack_default_graph", "quack_best_graph"]
    assert vs_quack.contenders(qk, False, (), [qk])[-1] == "coda_graph"
    g = vs_quack.GraphReplay(lambda: None, calls=20)
    assert g.graph is None  # nothing captured before the first call
    got = vs_quack.per_op_call(g, {"ms": 2.0, "warm_ms_per_call": 1.0, "clock_mhz": 1500})
    assert got == {"ms": 0.1, "warm_ms_per_call": 0.05, "clock_mhz": 1500, "graph_calls": 20}
    assert vs_quack.per_op_call(lambda: None, {"ms": 2.0}) == {"ms": 2.0}
    with pytest.raises(SystemExit):
        vs_quack.parse_args(["--graph-ops", "rmsnrom"])


def test_table_names_the_tuned_gemm_kernel():
    """CODA's cell carries the kernel coda_gemm ran (`gemm_choice`, recorded for gemm_gu / gemm_down)."""
    shape = (8, 16, 32)
    rows = [vs_quack.make_row("gemm_gu", "llama3-1B", shape, "cublas_gemm", {"ms": 1.0}, "abc1234", "cpu", "d"),
            vs_quack.make_row("gemm_gu", "llama3-1B", shape, "coda", {"ms": 0.96}, "abc1234", "cpu", "d",
                              gemm_choice="pp_128x192x64_c2x1_d6:raster=m,swizzle=8")]
    cells = [c.strip() for c in vs_quack.markdown_table(rows).splitlines()[2].split("|")[1:-1]]
    assert cells[4] == "0.960 (0.960) [pp_128x192x64_c2x1_d6:raster=m,swizzle=8]"
    rows[1].pop("gemm_choice")
    cells = [c.strip() for c in vs_quack.markdown_table(rows).splitlines()[2].split("|")[1:-1]]
    assert cells[4] == "0.960 (0.960)"


def test_block_rows_and_table():
    """Block rows carry suite "block" and the block's GEMM FLOPs; the README's block table gives compile / CODA,
    Liger / CODA and CODA / GEMMs alone, and the op table leaves the block out."""
    cfg = vs_quack.CONFIGS["llama3-1b"]
    shape = vs_quack.op_shape("block", cfg, 8192)
    ms = dict(gemm_only=10.0, coda=10.2, torch_compile=10.8, liger=11.0)
    rows = [vs_quack.make_row("block", "llama3-1B", shape, impl, {"ms": v}, "abc1234", "cpu", "d")
            for impl, v in ms.items()]
    assert {r["suite"] for r in rows} == {"block"} and rows[0]["pass"] == "fwdbwd"
    flop = 3 * sum(2 * m * n * k for m, n, k in vs_quack.block_gemms(cfg, 8192))
    assert rows[0]["tflops"] == pytest.approx(flop / (10.0 * 1e9))
    d, F, hq, hkv, hd = cfg
    assert vs_quack.block_gemms(cfg, 8192)[3] == (8192, (hq + 2 * hkv) * hd, d)
    table = vs_quack.block_table(rows)
    cells = [c.strip() for c in table.splitlines()[2].split("|")[1:-1]]
    assert cells == ["llama3-1B", "8192", "10.200", "10.800", "11.000", "10.000", f"{10.8 / 10.2:.3f}",
                     f"{11.0 / 10.2:.3f}", f"{10.2 / 10.0:.3f}", "-"]
    assert len(vs_quack.markdown_table(rows).splitlines()) == 2  # header and rule: no block line
    assert table in vs_quack.readme(rows)
    assert vs_quack.block_table([]) == ""


def test_commit_label_marks_a_tree_that_differs_from_head(tmp_path, monkeypatch):
    """report.commit (vs_quack's `commit` field): HEAD's short hash in a clean tree, "-dirty" once a tracked file
    differs (a device's copy of a working tree can carry an older .git), "unknown" without a repository."""
    import shutil
    import subprocess
    import report
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    monkeypatch.setattr(report, "ROOT", tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # no repository above tmp_path either
    assert report.commit() == "unknown"

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True).stdout
    git("init", "-q")
    (tmp_path / "f.txt").write_text("a\n")
    git("add", "f.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = git("rev-parse", "--short", "HEAD").strip()
    assert report.commit() == head
    (tmp_path / "untracked.txt").write_text("x\n")  # untracked files do not count
    assert report.commit() == head
    (tmp_path / "f.txt").write_text("b\n")
    assert report.commit() == head + "-dirty"


@pytest.mark.parametrize("op", ["linear_rowscale_qk_norm_rope", "linear_rowscale_rope"])
def test_coda_pins_pin_the_rowscale_floor_too(op, monkeypatch):
    """--coda-pins on the q/k/v ops: `coda:PIN` and, for a global config pin or a CODA_* variable, `coda_rowscale:PIN`
    (linear_rowscale at the same pin); a per-op pin names only the fused op, so the floor gets no pinned twin. The
    case's contenders are contenders()'s, and every call sets the pin's variable while it runs."""
    _cpu_stand_ins(monkeypatch)
    pins = ["coop_128x256x64_c2x1:raster=m,swizzle=8", "CODA_PDL=1", f"{op}=pp_128x128x64_c2x1"]
    assert vs_quack.floor_pins(pins) == pins[:2]
    seen = {}
    monkeypatch.setattr(vs_quack, "env_var", lambda var, value: _recording_env(seen, var, value))
    case = vs_quack.build_case(op, vs_quack.CONFIGS["tiny"], 128, None, device="cpu", coda_pins=pins)
    assert sorted(case.fns) == sorted(vs_quack.contenders(op, False, pins))  # the same set (pins last here)
    assert [i for i in case.fns if i.startswith("coda_rowscale:")] == [f"coda_rowscale:{p}" for p in pins[:2]]
    case.fns["coda_rowscale:" + pins[0]]()
    assert seen["CODA_OP_CONFIG"] == pins[0]
    case.fns["coda_rowscale:CODA_PDL=1"]()
    assert seen["CODA_PDL"] == "1"


def _recording_env(seen, var, value):
    import contextlib

    @contextlib.contextmanager
    def cm():
        seen[var] = value
        yield
    return cm()


def test_qwen3_configs_are_named_but_not_in_the_default_set():
    """--configs takes the Qwen3 shapes (head_dim 128, the QK-norm op's own) beside llama3's; the default stays the
    issue's three."""
    a = vs_quack.parse_args(["--configs", "Qwen3-4b,llama3-8B", "--ops", "linear_rowscale_qk_norm_rope"])
    assert a.configs == ["qwen3-4B", "llama3-8B"]
    assert vs_quack.parse_args([]).configs == list(vs_quack.MODEL_CONFIGS)
    d, F, hq, hkv, hd = vs_quack.CONFIGS["qwen3-4b"]
    assert vs_quack.op_shape("linear_rowscale_qk_norm_rope", vs_quack.CONFIGS["qwen3-4b"], 8192) == \
        (8192, (hq + 2 * hkv) * hd, d) == (8192, 6144, 2560)
    assert all(vs_quack.CONFIGS[c.lower()][4] == 128 for c in vs_quack.OTHER_CONFIGS)
