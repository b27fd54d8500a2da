"""What the Python benchmarks share: the model shapes, HF's RMSNorm and rotate-half as the PyTorch baselines write
them, the CUDA-event timer, and the import of the checkout's `coda` package."""
from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

CONFIGS = {  # d, F, hq, hkv, hd
    "llama3-1b": (2048, 8192, 32, 8, 64),
    "llama3-8b": (4096, 14336, 32, 8, 128),
    "llama3-70b": (8192, 28672, 64, 8, 128),
    # Qwen3 dense models (their HF configs: hidden, intermediate, heads, kv heads, head_dim 128 in all): the QK-norm
    # op's own shapes; llama3-1B's head_dim 64 is no Qwen3 model's.
    "qwen3-1.7b": (2048, 6144, 16, 8, 128),
    "qwen3-4b": (2560, 9728, 32, 8, 128),
    "qwen3-14b": (5120, 17408, 40, 8, 128),
    "tiny": (64, 128, 2, 1, 64),  # CPU smoke runs
}
EPS = 1e-5
QK_EPS = 1e-6  # the per-head q/k norm's eps: Qwen3's rms_norm_eps (its q_norm / k_norm use the model's)


def hf_rms_norm(x, w):
    """transformers' LlamaRMSNorm: fp32 statistics, the normalised input rounded to x's dtype, then * w."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    return w * h.to(x.dtype)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def is_cuda(device) -> bool:
    """device ("cuda", "cuda:1", torch.device) is a CUDA device."""
    return torch.device(device).type == "cuda"


def timed(fn, reps, warmup=3, device="cuda"):
    """Median milliseconds of fn() over reps calls after warmup calls: CUDA events on the GPU (each call synchronised
    at its end), wall clock on the CPU."""
    cuda = is_cuda(device)
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            ts.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(ts)


def timed_pipelined(fn, reps, warmup=3, device="cuda"):
    """Mean milliseconds per call of `reps` back-to-back calls of fn (CUDA events around the whole loop, one
    synchronize at the end): the CPU enqueues ahead of the GPU as in a training loop, so per-call host overhead is
    hidden wherever the GPU work is longer. `timed` (each call synchronized) exposes it; report both."""
    for _ in range(warmup):
        fn()
    if not is_cuda(device):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return 1e3 * (time.perf_counter() - t0) / reps
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / reps


# libcoda's fused ops as CODA_OP_CONFIG's per-op form names them (src/ops/op_config.cu refuses any other name).
FUSED_OPS = ("linear_rowscale", "linear_residual_rmsnorm", "linear_rowscale_swiglu", "linear_rowscale_rope",
             "linear_rowscale_qk_norm_rope", "linear_rowscale_lse", "linear_residual_rmsnorm_bwd",
             "linear_swiglu_bwd_zdz")


def fused_configs(op, fp16=False):
    """The mainloop configs libcoda compiles for fused op `op` (a FUSED_OPS name) as a tuple, in its dispatcher's
    order: coda_fused_op_configs, the list CODA_OP_CONFIG is checked against (no copy of it here)."""
    from coda import _C
    got = _C.library().coda_fused_op_configs(op.encode(), _C.DTYPE[torch.float16 if fp16 else torch.bfloat16])
    if got is None:
        raise ValueError(f"fused_configs: libcoda knows no fused op {op!r}")
    return tuple(got.decode().split(","))


@contextlib.contextmanager
def env_var(var, value):
    """The environment variable `var` set to `value` (None: unset) for the duration, then restored (or unset again).
    libcoda reads CODA_OP_CONFIG and CODA_GEMM_CONFIG on every call, so this pins a config per call."""
    old = os.environ.get(var)
    if value is None:
        os.environ.pop(var, None)
    else:
        os.environ[var] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = old


@functools.lru_cache(maxsize=None)
def _gemm_last_choice_fn():
    import ctypes

    from coda import _C
    f = _C.library().coda_gemm_last_choice
    f.restype, f.argtypes = ctypes.c_char_p, []
    return f


def last_gemm_choice():
    """The candidate coda_gemm ran last on this thread (config[:knobs] or cublas; the gemm_hooks.h test hook; the
    function looked up once, as timed calls record it). Raises RuntimeError where libcoda cannot be loaded."""
    return _gemm_last_choice_fn()().decode()


@contextlib.contextmanager
def env_vars(values):
    """Every VAR: value of `values` (a dict; None or {}: nothing) set for the duration as env_var sets one."""
    with contextlib.ExitStack() as stack:
        for var, value in (values or {}).items():
            stack.enter_context(env_var(var, value))
        yield


def parse_variants(op_specs, env_specs, error):
    """The CODA variants of the --coda-variant LABEL=SPEC and --coda-env LABEL=VAR=VALUE arguments (lists of
    strings): {"coda:LABEL": {VAR: VALUE}}, where --coda-variant LABEL=SPEC is CODA_OP_CONFIG=SPEC and a label named
    by several arguments collects their variables. error(message) is called (argparse's p.error: it exits) on a
    missing part, a label with a comma, a --coda-variant label that is a fused op's name (`op=config` without a
    label would pin every op in CODA_OP_CONFIG's global form), a variable not named CODA_[A-Z0-9_]+, or one
    variable set twice for a label."""
    variants = {}

    def add(arg, label, var, value, form):
        if not label or not value or "," in label:
            error(f"{arg!r}: expected {form} (LABEL without commas)")
        if form.startswith("LABEL=SPEC") and label.removeprefix("coda_") in FUSED_OPS:
            error(f"{arg!r}: the label {label!r} is a fused op's name; write LABEL={arg.split(' ', 1)[1]}")
        if not re.fullmatch(r"CODA_[A-Z0-9_]+", var):
            error(f"{arg!r}: {var!r} is not a CODA_* environment variable")
        env = variants.setdefault(f"coda:{label}", {})
        if var in env:
            error(f"{arg!r}: label {label!r} sets {var} twice")
        env[var] = value

    for v in op_specs:
        label, eq, spec = v.partition("=")
        add(f"--coda-variant {v}", label if eq else "", "CODA_OP_CONFIG", spec,
            "LABEL=SPEC, SPEC a CODA_OP_CONFIG value")
    for v in env_specs:
        label, eq, rest = v.partition("=")
        var, eq2, value = rest.partition("=")
        add(f"--coda-env {v}", label if eq and eq2 else "", var, value, "LABEL=VAR=VALUE")
    return variants


def interleaved(measures, rounds):
    """{name: fn() -> {key: ms}} -> {name: {key: median over rounds}}, or {name: {"error": ...}} for one that
    raised (it is dropped from later rounds). Every round runs each measure once, the order rotated by one per
    round. On the H200, timing one implementation's calls after another's moved ratios by up to 12 % for the same
    cuBLAS kernel on the same operands (bench/results/gemm_torch_h200_ba4949a.md); taking turns spreads the GPU's clock drift over
    all of them."""
    names = list(measures)
    rounds = max(1, rounds)
    got = {n: [] for n in names}
    errors = {}
    for r in range(rounds):
        for j in range(len(names)):
            n = names[(r + j) % len(names)]
            if n in errors:
                continue
            try:
                got[n].append(measures[n]())
            except Exception as e:  # report, do not hide: the row says what failed
                errors[n] = f"{type(e).__name__}: {e}"[:300]
    out = {}
    for n in names:
        if n in errors:
            out[n] = {"error": errors[n]}
        else:
            out[n] = {k: statistics.median(d[k] for d in got[n]) for k in got[n][0]}
            out[n]["rounds"] = len(got[n])
    return out


def peak_extra_gib(fn):
    """GiB that one call of fn allocates on the current CUDA device above what was allocated before it
    (torch.cuda.max_memory_allocated; fn has run once already, so its caches and autotuning are in place)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**30


def kernel_times(fn):
    """{GPU activity name: ms} of one call of fn (after one unprofiled call), from torch.profiler."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    fn()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    by = {}
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by[e.name] = by.get(e.name, 0.0) + e.device_time / 1e3
    return by


def append_jsonl(path, rows):
    """Appends rows (dicts) to the JSON-lines file `path`, creating its folder; nothing for a None path."""
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


class GpuSampler:
    """SM clock (MHz), power (W) and temperature (C) of the current GPU, sampled by `nvidia-smi -lms` while the
    `with` block runs: `.summary()` gives their means and extremes, or {} where nvidia-smi is missing or gave
    nothing (e.g. a MIG instance, whose clocks it does not report). A ratio between two implementations reads
    differently when one of them ran at a lower clock."""

    def __init__(self, period_ms=50):
        self.period_ms, self.proc, self.file, self.lines = period_ms, None, None, []

    def __enter__(self):
        import shutil
        import subprocess
        exe = shutil.which("nvidia-smi")
        if exe is None or not torch.cuda.is_available():
            return self
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        gpu = f"GPU-{props.uuid}" if getattr(props, "uuid", None) else str(torch.cuda.current_device())
        self.file = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: nothing has to drain it meanwhile
        self.proc = subprocess.Popen([exe, "-i", gpu, "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                                      "--format=csv,noheader,nounits", f"-lms={self.period_ms}"],
                                     stdout=self.file, stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, *exc):
        import subprocess
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.file.seek(0)
            self.lines = [ln for ln in self.file.read().splitlines() if ln.strip()]
            self.file.close()
        return False

    def summary(self):
        vals = []
        for ln in self.lines:
            try:
                vals.append([float(v) for v in ln.split(",")])
            except ValueError:
                continue
        if not vals:
            return {}
        clock, power, temp = zip(*vals)
        return dict(sm_clock_mhz=statistics.mean(clock), sm_clock_min_mhz=min(clock), power_w=statistics.mean(power),
                    power_max_w=max(power), temp_max_c=max(temp), telemetry_samples=len(vals))


def warm_for(fn, seconds, device="cuda", in_flight=4):
    """Calls fn back to back for at least `seconds` of wall time (PROTOCOL.md: each contender is warmed >= 2 s before
    it is timed, so the clock has settled at its sustained-load value) and returns the mean milliseconds per call
    over that time (at least one call). On the GPU at most `in_flight` calls are queued ahead of the one finished
    (a CUDA event after each), so the wall time follows the GPU's, not the CPU's enqueueing."""
    cuda = is_cuda(device)
    pending = []
    calls = 0
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    while True:
        fn()
        calls += 1
        if cuda:
            e = torch.cuda.Event()
            e.record()
            pending.append(e)
            if len(pending) > in_flight:
                pending.pop(0).synchronize()
        if time.perf_counter() - t0 >= seconds:
            break
    if cuda:
        torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t0) / calls


class NvmlSampler:
    """SM clock (MHz) and board power (W) of the current GPU, read through pynvml (nvidia-ml-py) by a background
    thread every `period_s` while the `with` block runs, plus once at its start and once at its end: `.summary()`
    gives clock_mhz / watts (means), clock_min_mhz and watts_max, and the sample count, or {} where pynvml or a CUDA
    GPU is missing. Lighter than GpuSampler (no nvidia-smi process per block), so it fits one timing of a few
    hundred milliseconds. NVML's power reading is itself an average over a short window of the driver's."""

    _handles = {}  # CUDA device index -> (pynvml, handle), or None where NVML is not usable

    def __init__(self, period_s=0.01):
        self.period_s, self.samples = period_s, []
        self._thread = self._stop = self._handle = self._nvml = None

    def _open(self):
        if not torch.cuda.is_available():
            return None
        dev = torch.cuda.current_device()
        if dev not in NvmlSampler._handles:
            NvmlSampler._handles[dev] = self._find(dev)
        got = NvmlSampler._handles[dev]
        if got is None:
            return None
        self._nvml, handle = got
        return handle

    @staticmethod
    def _find(dev):
        """(pynvml, the NVML handle of CUDA device dev: by UUID, which CUDA_VISIBLE_DEVICES does not renumber,
        else by index), or None."""
        try:
            import pynvml
            pynvml.nvmlInit()
        except Exception:  # ImportError: nvidia-ml-py is not installed; NVMLError: no driver
            return None
        try:
            uuid = getattr(torch.cuda.get_device_properties(dev), "uuid", None)
        except Exception:
            uuid = None
        if uuid:
            for key in (f"GPU-{uuid}", f"GPU-{uuid}".encode()):  # str in current pynvml, bytes in older ones
                try:
                    return pynvml, pynvml.nvmlDeviceGetHandleByUUID(key)
                except Exception:
                    continue
        try:
            return pynvml, pynvml.nvmlDeviceGetHandleByIndex(dev)
        except Exception:
            return None

    def _sample(self):
        try:
            clock = self._nvml.nvmlDeviceGetClockInfo(self._handle, self._nvml.NVML_CLOCK_SM)
            watts = self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0
        except Exception:
            return
        self.samples.append((float(clock), float(watts)))

    def __enter__(self):
        import threading
        self.samples = []
        self._handle = self._open()
        if self._handle is None:
            return self
        self._sample()
        self._stop = threading.Event()

        def loop():
            while not self._stop.wait(self.period_s):
                self._sample()
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._sample()
        return False

    def summary(self):
        if not self.samples:
            return {}
        clock, watts = zip(*self.samples)
        return dict(clock_mhz=statistics.mean(clock), clock_min_mhz=min(clock), watts=statistics.mean(watts),
                    watts_max=max(watts), nvml_samples=len(self.samples))


def short_kernel_name(name: str) -> str:
    """A readable label for a CUTLASS kernel's mangled name: schedule, wgmma atom, cluster scheduler and the CODA
    epilogue nodes / ops it instantiates ("plain" when none); other names are cut to 90 characters."""
    if not name.startswith("_ZN7cutlass13device_kernel"):
        return name[:90]
    coda = []
    for m in re.finditer(r"4coda", name):
        i, ids = m.end(), []
        for _ in range(2):  # namespace, then the name: <length><identifier>
            n = re.match(r"\d+", name[i:])
            if not n:
                break
            k = int(n.group())
            ids.append(name[i + len(n.group()):i + len(n.group()) + k])
            i += len(n.group()) + k
        if len(ids) == 2 and ids[1] not in coda:
            coda.append(ids[1])
    sched = "pingpong" if "Pingpong" in name else "coop" if "Cooperative" in name else "?"
    atom = re.search(r"MMA_(\d+x\d+x\d+)", name)
    tiles = "streamk" if "StreamK" in name else "persistent"
    return f"cutlass {sched} {atom.group(1) if atom else '?'} {tiles} [{', '.join(coda) or 'plain'}]"


def is_gemm_kernel(name: str) -> bool:
    """A GEMM kernel of the timeline: cuBLAS's nvjet / cutlass / xmma kernels, its split-K reduce, CUTLASS's
    device_kernel instantiations (CODA's fused and plain GEMMs) and Inductor's Triton GEMM templates."""
    return name.startswith("_ZN7cutlass13device_kernel") or re.search(
        r"nvjet|cutlass|gemm|xmma|splitKreduce|triton_tem_", name, re.IGNORECASE) is not None


def gemm_split(kernels):
    """[(name, duration)] -> (GEMM time, GEMM launches, other kernel time), in the durations' unit."""
    gemm = [d for n, d in kernels if is_gemm_kernel(n)]
    return sum(gemm), len(gemm), sum(d for n, d in kernels if not is_gemm_kernel(n))


def profile(name, fn, reps=3, rows=12):
    """--profile: where one call of fn spends its time on the GPU timeline (torch.profiler, CPU + CUDA).

    Prints, for the last of `reps` calls (each ended by a synchronize): the call's wall span, the summed kernel
    time, the GPU-idle time inside the span split into before the first kernel / between kernels / after the last,
    the GEMM kernels' total against the other kernels' (gemm_split), the largest gaps with the kernels around them,
    the longest CUDA runtime calls (a blocking one shows here), the kernels in launch order (the first 40) and by
    total time (the top `rows`; CUTLASS names through short_kernel_name). The CPU-side wall time of fn() without
    the synchronize (the enqueue cost) comes first."""
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as torch_profile
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    enqueue_ms = 1e3 * (time.perf_counter() - t0)
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            with record_function(f"bench_call_{i}"):
                fn()
                torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as trace:
            events = json.load(trace)["traceEvents"]
    call = next(e for e in events if e.get("name") == f"bench_call_{reps - 1}" and e.get("ph") == "X"
                and e.get("cat") == "user_annotation")
    lo, hi = call["ts"], call["ts"] + call["dur"]
    inside = [e for e in events if e.get("ph") == "X" and lo <= e.get("ts", -1) <= hi]
    gpu = sorted((e for e in inside if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    api = sorted((e for e in inside if e.get("cat") in ("cuda_runtime", "cuda_driver")), key=lambda e: -e["dur"])
    busy = sum(e["dur"] for e in gpu)
    print(f"--- {name}: enqueue (CPU, no sync) {enqueue_ms:.3f} ms; profiled call span {call['dur'] / 1e3:.3f} ms, "
          f"kernels {busy / 1e3:.3f} ms in {len(gpu)}")
    g_ms, g_n, other = gemm_split([(e["name"], e["dur"] / 1e3) for e in gpu if e.get("cat") == "kernel"])
    print(f"  GEMM kernels {g_ms:.3f} ms in {g_n}; other kernels {other:.3f} ms; memcpy/memset "
          f"{sum(e['dur'] for e in gpu if e.get('cat') != 'kernel') / 1e3:.3f} ms")
    if gpu:
        gaps = [(gpu[i + 1]["ts"] - (gpu[i]["ts"] + gpu[i]["dur"]), i) for i in range(len(gpu) - 1)]
        print(f"  idle: before first kernel {(gpu[0]['ts'] - lo) / 1e3:.3f} ms, between kernels "
              f"{sum(max(g, 0) for g, _ in gaps) / 1e3:.3f} ms, after last {(hi - gpu[-1]['ts'] - gpu[-1]['dur']) / 1e3:.3f} ms")
        for g, i in sorted(gaps, reverse=True)[:3]:
            print(f"  gap {g / 1e3:.3f} ms after {short_kernel_name(gpu[i]['name'])[:60]} | "
                  f"before {short_kernel_name(gpu[i + 1]['name'])[:60]}")
    for e in api[:5]:
        print(f"  runtime {e['dur'] / 1e3:8.3f} ms  {e['name'][:80]}")
    print("  kernels in launch order:")
    for i, e in enumerate(gpu[:40]):
        print(f"  {i:3d} {e['dur'] / 1e3:8.3f} ms  {short_kernel_name(e['name'])}")
    by = {}
    for e in gpu:
        k = short_kernel_name(e["name"])
        t, n = by.get(k, (0, 0))
        by[k] = (t + e["dur"], n + 1)
    print("  by kernel:")
    for k, (t, n) in sorted(by.items(), key=lambda kv: -kv[1][0])[:rows]:
        print(f"  {t / 1e3:8.3f} ms  x{n:<3d} {k}")
