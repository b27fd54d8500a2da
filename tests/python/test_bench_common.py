"""The benchmark suite's timing helpers (bench/python/common.py), on the CPU: implementations take turns in
rotating order, a failing one is reported and dropped, the result is the median over rounds."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "python"))

import common  # noqa: E402


def test_interleaved_rotates_order_and_takes_medians():
    order = []

    def measure(name, values):
        it = iter(values)

        def fn():
            order.append(name)
            return {"ms": next(it)}
        return fn
    out = common.interleaved({"a": measure("a", [1.0, 9.0, 2.0]), "b": measure("b", [5.0, 4.0, 6.0]),
                              "c": measure("c", [7.0, 7.0, 0.5])}, rounds=3)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert out["a"] == {"ms": 2.0, "rounds": 3}
    assert out["b"] == {"ms": 5.0, "rounds": 3}
    assert out["c"] == {"ms": 7.0, "rounds": 3}


def test_interleaved_reports_a_failure_and_drops_it():
    calls = {"ok": 0, "bad": 0}

    def ok():
        calls["ok"] += 1
        return {"ms": 1.0}

    def bad():
        calls["bad"] += 1
        raise RuntimeError("out of memory")
    out = common.interleaved({"ok": ok, "bad": bad}, rounds=4)
    assert calls == {"ok": 4, "bad": 1}
    assert out["bad"] == {"error": "RuntimeError: out of memory"}
    assert out["ok"]["ms"] == 1.0 and out["ok"]["rounds"] == 4


def test_gpu_sampler_samples_the_gpu_or_gives_nothing():
    """Without a CUDA GPU nothing is sampled ({}); with one and nvidia-smi, the clock and power of the block."""
    import shutil
    import time

    import torch
    with common.GpuSampler() as s:
        time.sleep(0.5)
    got = s.summary()
    if not torch.cuda.is_available() or shutil.which("nvidia-smi") is None:
        assert got == {}
    else:
        assert got["telemetry_samples"] >= 1 and got["sm_clock_mhz"] > 0 and got["power_w"] > 0


def test_sweep_ops_pins_and_environment():
    """bench/python/sweep_ops.py: the default candidates, and a pinned call sets CODA_OP_CONFIG only for its
    duration (restoring an outer value, or its absence)."""
    import os

    from coda import _C
    if not _C.available():  # the pins are the configs the library lists: README's build-free Python run skips this
        pytest.skip("libcoda is not built (tools/build) or not found (CODA_BUILD_DIR, CODA_LIBRARY)")
    import sweep_ops
    pins = sweep_ops.default_pins()  # linear_rowscale_swiglu: the configs libcoda lists for it
    assert pins[0] == "default" and len(pins) == 1 + 3 * 8 and len(set(pins)) == len(pins)
    assert "coop_128x256x64_c2x1:raster=n,swizzle=2" in pins and "pp_128x128x64_c2x1:raster=m,swizzle=8" in pins
    assert "pp_128x192x64_c2x1:raster=n,swizzle=8" in pins
    # linear_swiglu_bwd_zdz: pingpong 128x128, and 128x192 with 64x16 subtiles (e16, e16h)
    backward = sweep_ops.default_pins("linear_swiglu_bwd_zdz")
    assert backward[0] == "default" and len(backward) == 1 + 3 * 8 and not any("coop" in p for p in backward)
    assert "pp_128x192x64_c2x1_e16:raster=n,swizzle=8" in backward
    assert "pp_128x192x64_c2x1_e16h:raster=n,swizzle=8" in backward
    norm_down = sweep_ops.default_pins("linear_residual_rmsnorm@down")
    assert len(norm_down) == 1 + 2 * 8 and not any("192" in p for p in norm_down)
    plain = sweep_ops.default_pins("gemm_gu")  # the forward layout's seven compiled configs
    assert len(plain) == 1 + 7 * 8 and "sk_128x256x64_c2x1:raster=m,swizzle=2" in plain
    assert not any("c2x2" in p for p in plain)
    seen = []
    probe = lambda: seen.append(os.environ.get("CODA_OP_CONFIG"))  # noqa: E731
    old = os.environ.pop("CODA_OP_CONFIG", None)
    try:
        sweep_ops.pinned("pp_128x128x64_c2x1:raster=n,swizzle=8", probe)()
        assert "CODA_OP_CONFIG" not in os.environ
        os.environ["CODA_OP_CONFIG"] = "outer"
        sweep_ops.pinned("default", probe)()
        assert os.environ["CODA_OP_CONFIG"] == "outer"
    finally:
        os.environ.pop("CODA_OP_CONFIG", None)
        if old is not None:
            os.environ["CODA_OP_CONFIG"] = old
    sweep_ops.pinned("cublas", lambda: seen.append(os.environ.get("CODA_GEMM_CONFIG")), "CODA_GEMM_CONFIG")()
    assert "CODA_GEMM_CONFIG" not in os.environ
    assert seen == ["pp_128x128x64_c2x1:raster=n,swizzle=8", None, "cublas"]
    got = {"default": {"ms": 2.0}, sweep_ops.REPEAT: {"ms": 2.1}, "x": {"error": "E"}}
    assert abs(sweep_ops.noise_floor(got) - 0.05) < 1e-12
    assert sweep_ops.noise_floor({"default": {"ms": 2.0}, sweep_ops.REPEAT: {"error": "E"}}) is None


def test_bench_block_variant_sets_op_config_around_forward_and_backward():
    """bench_block.py --coda-variant: CODA_OP_CONFIG is the variant's spec during the forward and the backward of
    each call (the backward's fused ops read it too), and the outer value is back after; no spec leaves it alone."""
    import os

    import bench_block
    import torch
    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            seen.append(("fwd", os.environ.get("CODA_OP_CONFIG")))
            return x * 2

        @staticmethod
        def backward(ctx, g):
            seen.append(("bwd", os.environ.get("CODA_OP_CONFIG")))
            return g * 2
    x = torch.ones(3, requires_grad=True)
    old = os.environ.get("CODA_OP_CONFIG")
    os.environ["CODA_OP_CONFIG"] = "outer"
    try:
        spec = "linear_rowscale_swiglu=coop_128x256x64_c2x1:raster=m,swizzle=8"
        _, measure, calls = bench_block.prepare_impl("coda:x", lambda a: (Probe.apply(a),), [x], [], 1, "cpu",
                                                     {"CODA_OP_CONFIG": spec})
        assert seen == [("fwd", spec), ("bwd", spec)]  # the warm-up forward+backward
        assert os.environ["CODA_OP_CONFIG"] == "outer"
        seen.clear()
        calls["forward"]()
        assert seen == [("fwd", spec)] and os.environ["CODA_OP_CONFIG"] == "outer"
        seen.clear()
        bench_block.prepare_impl("coda", lambda a: (Probe.apply(a),), [x], [], 1, "cpu", None)
        assert seen == [("fwd", "outer"), ("bwd", "outer")]
    finally:
        if old is None:
            os.environ.pop("CODA_OP_CONFIG", None)
        else:
            os.environ["CODA_OP_CONFIG"] = old


def test_gemm_split_classifies_the_timeline_kernels():
    """--profile's GEMM / other split: cuBLAS, CUTLASS (CODA's fused GEMMs) and split-K reduces are GEMM time;
    Triton, ATen elementwise and CODA's small kernels are not."""
    ks = [("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", 1.0),
          ("_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalIN4cute5tupleIJiiiiEEE", 2.0),
          ("void cublasLt::splitKreduce_kernel<32, 16, int, float>", 0.25),
          ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", 0.5),
          ("triton_poi_fused_mul_silu_1", 0.125),
          ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>>", 0.0625),
          ("void coda::kernels::(anonymous namespace)::scale_cast_vec8_kernel<__nv_bfloat16>", 0.03125)]
    assert common.gemm_split(ks) == (3.75, 4, 0.21875)
    assert common.gemm_split([]) == (0, 0, 0)


def test_bench_block_refuses_ambiguous_variants():
    """--coda-variant without a label ("op=config") would pin every fused op; a repeated label would hide a run."""
    import subprocess
    script = Path(__file__).resolve().parents[2] / "bench" / "python" / "bench_block.py"
    for args, says in ((["--coda-variant", "linear_rowscale_swiglu=pp_128x128x64_c2x1"], "is a fused op's name"),
                       (["--coda-variant", "a=x", "--coda-variant", "a=y"], "sets CODA_OP_CONFIG twice"),
                       (["--coda-variant", "nolabel"], "expected LABEL=SPEC")):
        r = subprocess.run([sys.executable, str(script), "--device", "cpu", *args], capture_output=True, text=True,
                           cwd=script.parent, timeout=120)
        assert r.returncode == 2 and says in r.stderr, (args, r.stderr[-500:])


def test_parse_variants_collects_env_per_label_and_refuses_bad_ones():
    """--coda-variant LABEL=SPEC is CODA_OP_CONFIG=SPEC; --coda-env LABEL=VAR=VALUE adds any CODA_* variable; a label
    named by both gets both; every malformed or ambiguous argument is refused with the argument in the message."""
    errors = []

    def error(msg):
        errors.append(msg)
        raise SystemExit(2)
    # --coda-env may use a fused op's name as its label: only CODA_OP_CONFIG's LABEL=SPEC form is ambiguous
    assert common.parse_variants([], ["linear_rowscale=CODA_GEMM_CONFIG=cublas"], error) == {
        "coda:linear_rowscale": {"CODA_GEMM_CONFIG": "cublas"}}
    got = common.parse_variants(["swiglu=linear_rowscale_swiglu=pp_128x128x64_c2x1", "both=pp_128x128x64_c2x1"],
                                ["cublas=CODA_GEMM_CONFIG=cublas", "both=CODA_GEMM_CONFIG=cublas:x=1"], error)
    assert got == {"coda:swiglu": {"CODA_OP_CONFIG": "linear_rowscale_swiglu=pp_128x128x64_c2x1"},
                   "coda:both": {"CODA_OP_CONFIG": "pp_128x128x64_c2x1", "CODA_GEMM_CONFIG": "cublas:x=1"},
                   "coda:cublas": {"CODA_GEMM_CONFIG": "cublas"}}
    for ops, envs, says in (([], ["cublas=CODA_GEMM_CONFIG"], "expected LABEL=VAR=VALUE"),
                            ([], ["=CODA_GEMM_CONFIG=cublas"], "expected LABEL=VAR=VALUE"),
                            ([], ["a,b=CODA_GEMM_CONFIG=cublas"], "without commas"),
                            ([], ["x=PATH=/tmp"], "not a CODA_* environment variable"),
                            ([], ["x=CODA_GEMM_CONFIG=a", "x=CODA_GEMM_CONFIG=b"], "sets CODA_GEMM_CONFIG twice"),
                            (["x=a"], ["x=CODA_OP_CONFIG=b"], "sets CODA_OP_CONFIG twice"),
                            ([], ["x=CODA_=1"], "not a CODA_* environment variable"),
                            ([], ["x=CODA_\u00c9=1"], "not a CODA_* environment variable"),
                            (["linear_rowscale=pp_128x128x64_c2x1"], [], "is a fused op's name"),
                            (["nolabel"], [], "expected LABEL=SPEC")):
        errors.clear()
        try:
            common.parse_variants(ops, envs, error)
        except SystemExit:
            pass
        assert errors and says in errors[0], (ops, envs, errors)


def test_env_vars_sets_and_restores_each_variable():
    import os
    os.environ.pop("CODA_TEST_A", None)
    os.environ["CODA_TEST_B"] = "outer"
    try:
        with common.env_vars({"CODA_TEST_A": "1", "CODA_TEST_B": "2"}):
            assert os.environ["CODA_TEST_A"] == "1" and os.environ["CODA_TEST_B"] == "2"
        assert "CODA_TEST_A" not in os.environ and os.environ["CODA_TEST_B"] == "outer"
        with common.env_vars(None):
            assert os.environ["CODA_TEST_B"] == "outer"
    finally:
        os.environ.pop("CODA_TEST_B", None)


def test_bench_lm_head_refuses_a_chunk_label_taken_by_a_variant():
    """--coda-chunk-rows N adds coda:chunkN; a variant of that label would silently mix the two."""
    import subprocess
    script = Path(__file__).resolve().parents[2] / "bench" / "python" / "bench_lm_head.py"
    r = subprocess.run([sys.executable, str(script), "--device", "cpu", "--coda-chunk-rows", "16",
                        "--coda-env", "chunk16=CODA_GEMM_CONFIG=cublas"], capture_output=True, text=True,
                       cwd=script.parent, timeout=120)
    assert r.returncode == 2 and "also a --coda-variant/--coda-env label" in r.stderr, r.stderr[-500:]


def test_lm_head_dw_rounding_fp32_sum_matches_unfused_and_bf16_sum_grows_with_chunks():
    """bench/python/lm_head_dw_rounding.py (the LM-head memory analysis, bench/results/lm_head_memory): the fp32
    running sum of dW over token chunks has the unfused pipeline's error exactly (ratio 1.00), and the bf16 running
    sum's error grows with the chunk count; a small case so it runs in a second on the CPU."""
    import re
    import subprocess
    script = Path(__file__).resolve().parents[2] / "bench" / "python" / "lm_head_dw_rounding.py"
    r = subprocess.run([sys.executable, str(script), "--tokens", "2048", "--vocab", "256", "--hidden", "64",
                        "--chunks", "2,32"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-500:]
    rows = [ln for ln in r.stdout.splitlines() if re.match(r"\| (2|32) \|", ln)]
    assert len(rows) == 2, r.stdout
    fp32 = [float(ln.split("|")[4]) for ln in rows]
    bf16 = [float(ln.split("|")[6]) for ln in rows]
    assert fp32 == [1.0, 1.0], r.stdout
    assert bf16[1] > bf16[0] > 1.0 and bf16[1] > 2.0, r.stdout


def test_lce_target_rounding_puts_the_single_row_gap_on_the_target_entry():
    """bench/python/lce_target_rounding.py (bench/results/vs_quack/lm_head_exp): on one-row problems the exponential
    form exceeds the acceptance bound for some seeds, and carrying the target entry exactly brings it back under."""
    import subprocess
    script = Path(__file__).resolve().parents[2] / "bench" / "python" / "lce_target_rounding.py"
    r = subprocess.run([sys.executable, str(script), "--seeds", "200"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-500:]
    over = {ln[:17].strip(): float(ln.split()[-1]) for ln in r.stdout.splitlines()[1:]}
    assert over["exponential form"] > 0.03, r.stdout
    assert over["E_t exact"] < over["exponential form"] / 4, r.stdout
