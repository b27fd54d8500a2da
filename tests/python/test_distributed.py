"""CODA under PyTorch's own multi-process training engine: FSDP2 (torch.distributed.fsdp.fully_shard), DDP,
torch.distributed.checkpoint and activation checkpointing.

CPU (CI): 2 processes on the gloo backend run CODA's float64 reference path; each takes half of a batch, and the
loss and every gradient must equal the single-process run on the whole batch (same math, summed in another order:
float64 rounding only). The processes are started once for the module (each spawned process imports torch and CODA
again) and run every scenario; each test then checks its scenario's result. GPU: world size 1 with NCCL, bf16.
"""
from __future__ import annotations

import copy
import functools
import os
import socket
import time
import traceback
import warnings
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.utils.checkpoint

import coda
from coda.models.llama import LlamaConfig, LlamaForCausalLM, LlamaLayer
from conftest import requires_gpu

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")

WORLD = 2
TIGHT = 1e-10  # float64: the sharded and single-process runs differ in summation order only
ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}


def config(**kw):
    """tests/python/test_hf.py's hf_config as a CODA config: 3 layers, so the fused path runs two blocks."""
    base = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=ROPE,
                tie_word_embeddings=True)
    base.update(kw)
    return LlamaConfig(**base)


def model(seed=0, dtype=torch.float64, **kw):
    torch.manual_seed(seed)
    m = LlamaForCausalLM(config(**kw), dtype=dtype)
    with torch.no_grad():  # norms away from 1, so their gradients and the layouts' permutations matter
        for n, p in m.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.2 * torch.randn_like(p))
    return m


def batch():
    return torch.randint(0, 512, (2 * WORLD, 24), generator=torch.Generator().manual_seed(7))


def loss_and_grads(m, ids, **kw):
    m.zero_grad(set_to_none=True)
    out = m(input_ids=ids, labels=ids, **kw)  # CODA's LlamaForCausalLM and HF's alike
    out.loss.backward()
    return out.loss.detach(), {n: _full(p.grad) for n, p in m.named_parameters()}


def _full(t):
    """A DTensor (FSDP2) -> its full value (gathered on the mesh's device: CPU offload keeps shards on the CPU);
    plain tensors as they are."""
    from torch.distributed.tensor import DTensor
    if isinstance(t, DTensor):
        t = t.to(t.device_mesh.device_type).full_tensor()
    return t.detach().clone()


def rel_err(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-300)).item()


def worst(grads, ref, strip=""):
    """Largest relative gradient error over the parameters, and which one."""
    errs = {n: rel_err(g, ref[n.replace(strip, "")]) for n, g in grads.items()}
    name = max(errs, key=errs.get)
    return errs[name], name


# ---- the scenarios (each rank runs every one; a failure is recorded, not raised, so the others still run) ---------

def _mean_loss(loss):
    t = loss.detach().clone()
    dist.all_reduce(t)
    return (t / dist.get_world_size()).item()


def compared(loss, grads, ref_loss, ref_grads, strip=""):
    """What check_equal reads: a run's loss, the reference's, and the worst relative gradient error against it."""
    return dict(loss=float(loss), ref_loss=float(ref_loss), grad=worst(grads, ref_grads, strip))


def _vs_single_process(m, ctx, strip=""):
    """m's run on this rank's half of the batch (the loss averaged over the ranks) against the single-process run."""
    loss, grads = loss_and_grads(m, ctx["mine"])
    return compared(_mean_loss(loss), grads, ctx["ref_loss"], ctx["ref_grads"], strip)


_CPU_MESH = []


def _cpu_mesh():
    """The gloo workers' 1-D CPU mesh. fully_shard's default mesh takes the machine's accelerator (cuda where one is
    visible), which would move the CPU test's parameters to the GPU under a gloo process group."""
    if not _CPU_MESH:
        from torch.distributed.device_mesh import init_device_mesh
        _CPU_MESH.append(init_device_mesh("cpu", (dist.get_world_size(),)))
    return _CPU_MESH[0]


def _shard(m, per_layer=True, **kw):
    from torch.distributed.fsdp import fully_shard
    if dist.get_backend() == "gloo":
        kw.setdefault("mesh", _cpu_mesh())
    if per_layer:
        for layer in m.model.layers:
            fully_shard(layer, **kw)
    fully_shard(m, **kw)
    return m


def scenario_fsdp(ctx):
    """fully_shard per decoder layer and at the root: the layers run one by one (LlamaLayer.forward)."""
    m = _shard(model())
    assert not m.model.fused()
    result = _vs_single_process(m, ctx)
    ctx["fsdp_model"] = m
    return result


def scenario_fsdp_root(ctx):
    """fully_shard at the root only: inside the forward every weight is gathered, so the fused path runs."""
    m = _shard(model(), per_layer=False)
    assert m.model.fused()
    return _vs_single_process(m, ctx)


def scenario_fsdp_checkpointed(ctx):
    """torchtitan's order: activation checkpointing per layer, then fully_shard per layer and root."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (apply_activation_checkpointing,
                                                                             checkpoint_wrapper)
    m = model()
    apply_activation_checkpointing(m, checkpoint_wrapper_fn=checkpoint_wrapper,
                                   check_fn=lambda mod: isinstance(mod, LlamaLayer))
    return _vs_single_process(_shard(m), ctx, strip="_checkpoint_wrapped_module.")


def scenario_ddp(ctx):
    from torch.nn.parallel import DistributedDataParallel as DDP
    return _vs_single_process(DDP(model()), ctx, strip="module.")


def scenario_fsdp_mixed_precision(ctx):
    """fp32 parameters, bf16 all-gather and compute, fp32 gradient reduction. Judged as PROTOCOL.md judges bf16:
    its error against the float64 run must stay within 2x that of the single-process bf16 run (compute_dtype)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    base = model().float()
    l64, ref = loss_and_grads(copy.deepcopy(base).double(), ctx["ids"])  # the float64 run of these fp32 weights
    m = _shard(copy.deepcopy(base), mp_policy=mp)
    loss, grads = loss_and_grads(m, ctx["mine"])
    loss1, grads1 = loss_and_grads(copy.deepcopy(base), ctx["ids"], compute_dtype=torch.bfloat16)
    flat = lambda g: torch.cat([g[n].double().flatten() for n in ref])  # noqa: E731
    g_ref = flat(ref)
    return dict(loss=_mean_loss(loss), ref_loss=l64.item(), single_loss=loss1.item(),
                dtypes=sorted({str(g.dtype) for g in grads.values()}),
                err=((flat(grads) - g_ref).norm() / g_ref.norm()).item(),
                single_err=((flat(grads1) - g_ref).norm() / g_ref.norm()).item())


def scenario_checkpoint_roundtrip(ctx):
    """torch.distributed.checkpoint save and load of the sharded model's state_dict (Hugging Face names), into a
    differently initialised sharded model; and a full (plain) HF state dict loaded into a sharded model."""
    import torch.distributed.checkpoint as dcp
    src = ctx["fsdp_model"]
    sd = src.state_dict()
    path = os.path.join(ctx["out"], "dcp")
    dcp.save(sd, checkpoint_id=path)
    dst = _shard(model(seed=1))
    sd2 = dst.state_dict()
    dcp.load(sd2, checkpoint_id=path)
    dst.load_state_dict(sd2, strict=True)
    want = {n: _full(p) for n, p in src.named_parameters()}
    got = {n: _full(p) for n, p in dst.named_parameters()}
    roundtrip = max((got[n] - want[n]).abs().max().item() for n in want)
    full = _shard(model(seed=2))
    full.load_state_dict(ctx["ref_state"], strict=True)  # plain full tensors: each rank keeps its shard
    ref_params = dict(model().named_parameters())
    loaded = max((_full(p) - ref_params[n]).abs().max().item() for n, p in full.named_parameters())
    return dict(keys=sorted(sd), roundtrip=roundtrip, full_load=loaded,
                placements=sorted({str(v.placements) for v in sd.values()}))


def scenario_patch_llama(ctx):
    """coda.patch_llama'd transformers model under DDP, root-level fully_shard, and fully_shard per decoder layer
    (the layers then run one by one through their modules: FSDP2 gathers each layer's weights around its call)."""
    from test_hf import hf_config, random_model
    return _patched_under_ddp_and_fsdp(ctx, coda.patch_llama(random_model(hf_config()).double()))


def scenario_patch_qwen3(ctx):
    """The same for coda.patch_qwen3 on a transformers Qwen3 model (its q_norm / k_norm weights sharded too)."""
    try:
        from test_hf_qwen3 import qwen3_config, random_model
    except Exception as e:  # transformers without Qwen3: pytest.skip raised at import
        return dict(skipped=str(e))
    return _patched_under_ddp_and_fsdp(ctx, coda.patch_qwen3(random_model(qwen3_config()).double()))


def _patched_under_ddp_and_fsdp(ctx, ref):
    import transformers
    from torch.nn.parallel import DistributedDataParallel as DDP
    ids = ctx["ids"]
    l_ref, g_ref = loss_and_grads(copy.deepcopy(ref), ids)
    out = {}
    for key, wrap, strip in (("ddp", DDP, "module."), ("fsdp_root", functools.partial(_shard, per_layer=False), ""),
                             ("fsdp", _shard, "")):
        loss, grads = loss_and_grads(wrap(copy.deepcopy(ref)), ctx["mine"])
        out[key] = compared(_mean_loss(loss), grads, l_ref, g_ref, strip)
    out["transformers"] = transformers.__version__
    return out


def scenario_nn_modules(ctx):
    """coda.nn.LlamaBlock (its RMSNormQKVRope and SwiGLUMLP inside) under fully_shard, each rank on half of the
    rows: the mean output's gradients equal the single-process run's, and the sharded state dict (HF names, gate/up
    and q/k/v split on each rank) equals the unsharded one."""
    hq, hkv, hd, d, f = 4, 2, 64, 128, 256

    def make():
        torch.manual_seed(3)
        return coda.nn.LlamaBlock(d, f, hq, hkv, hd, 1e-5, dtype=torch.float64)

    g = torch.Generator().manual_seed(5)
    y0 = torch.randn(2 * WORLD, 8, hq * hd, generator=g, dtype=torch.float64)
    x0 = torch.randn(2 * WORLD, 8, d, generator=g, dtype=torch.float64)
    pos = torch.arange(8, dtype=torch.int32).expand(2 * WORLD, 8).contiguous()
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))

    def run(m, rows):
        m.zero_grad(set_to_none=True)
        x2, qkv = m(y0[rows], x0[rows], pos[rows], inv.float())
        loss = x2.mean() + qkv.mean()
        loss.backward()
        return loss.detach(), {n: _full(p.grad) for n, p in m.named_parameters()}

    ref = make()
    l_ref, g_ref = run(ref, slice(None))
    n = 2 * WORLD // dist.get_world_size()
    rank = dist.get_rank()
    from torch.distributed.fsdp import fully_shard
    m = fully_shard(make(), mesh=_cpu_mesh())
    loss, grads = run(m, slice(rank * n, (rank + 1) * n))
    sd_ref = ref.state_dict()
    sd = {k: _full(v) for k, v in m.state_dict().items()}
    state = max((sd[k] - sd_ref[k]).abs().max().item() for k in sd_ref) if sorted(sd) == sorted(sd_ref) else None
    return dict(compared(_mean_loss(loss), grads, l_ref, g_ref), state=state)


SCENARIOS = [scenario_fsdp, scenario_fsdp_root, scenario_fsdp_checkpointed, scenario_ddp,
             scenario_fsdp_mixed_precision, scenario_checkpoint_roundtrip, scenario_patch_llama, scenario_patch_qwen3,
             scenario_nn_modules]


def _worker(rank, world, out):
    torch.set_num_threads(1)  # two processes on (at least) two cores
    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    ids = batch()
    ref = model()
    ref_loss, ref_grads = loss_and_grads(ref, ids)
    n = ids.shape[0] // world
    ctx = dict(out=out, ids=ids, mine=ids[rank * n:(rank + 1) * n], ref_loss=ref_loss.item(), ref_grads=ref_grads,
               ref_state=ref.state_dict())
    results = {}
    for fn in SCENARIOS:
        name = fn.__name__.removeprefix("scenario_")
        try:
            results[name] = ("ok", fn(ctx))
        except Exception:  # recorded for the test that reads it; the ranks stay in step (every scenario runs)
            results[name] = ("error", traceback.format_exc())
        dist.barrier()
    path = os.path.join(out, f"rank{rank}.pt")
    torch.save(results, path + ".part")
    os.replace(path + ".part", path)  # whole or absent: the fixture reads it even when teardown fails
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    import torch.multiprocessing as mp
    out = tmp_path_factory.mktemp("dist")
    ctx = mp.start_processes(_worker, args=(WORLD, str(out)), nprocs=WORLD, start_method="spawn", join=False)
    deadline = 600
    t0 = time.monotonic()
    files = [out / f"rank{r}.pt" for r in range(WORLD)]
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() - t0 > deadline:
                for p in ctx.processes:
                    p.kill()
                pytest.fail(f"the {WORLD} processes did not finish in {deadline} s")
    except mp.ProcessExitedException as e:
        # Each rank saves its results after the last scenario's barrier, before destroy_process_group: a rank that
        # dies after that (once in nine CPU CI runs on 2026-12-05: "terminate called without an active exception"
        # from gloo's teardown, after the last scenario's output) has nothing left to report. A death before it fails
        # the fixture.
        if not all(f.exists() for f in files):
            raise
        warnings.warn(f"a rank died after saving its results (gloo teardown): {e}")
    return dict(out=out, ranks=[torch.load(f, weights_only=False) for f in files])


def get(results, name):
    results = results["ranks"]
    for rank, res in enumerate(results):
        status, value = res[name]
        assert status == "ok", f"rank {rank}, scenario {name}:\n{value}"
    return results[0][name][1]


def check_equal(r):
    assert abs(r["loss"] - r["ref_loss"]) <= TIGHT * abs(r["ref_loss"]), r
    err, name = r["grad"]
    assert err <= TIGHT, f"{name}: relative gradient error {err:.3e}"


@pytest.mark.parametrize("name", ["fsdp", "fsdp_root", "fsdp_checkpointed", "ddp"])
def test_cpu_gloo_two_processes_equal_single_process(results, name):
    """LlamaForCausalLM: FSDP2 per layer + root (the layer-by-layer path), root only (the fused path), with
    activation checkpointing per layer, and DDP: the loss and every gradient equal the single-process run's."""
    check_equal(get(results, name))


def test_cpu_gloo_fsdp_mixed_precision(results):
    r = get(results, "fsdp_mixed_precision")
    assert r["dtypes"] == ["torch.float32"], r  # fp32 gradients on the fp32 parameters
    assert abs(r["loss"] - r["ref_loss"]) <= 2e-2 * abs(r["ref_loss"]), r
    assert r["err"] <= 2 * r["single_err"] + 1e-6, r


def test_cpu_gloo_distributed_checkpoint_in_hf_names(results, tmp_path):
    r = get(results, "checkpoint_roundtrip")
    assert r["roundtrip"] == 0.0 and r["full_load"] == 0.0, r
    # saved from shards, never gathered: FSDP2's dim-0 shards, and dim 1 for the q/k/v and gate/up split of CODA's
    # layouts (nn._rows_local)
    assert r["placements"] == ["(Shard(dim=0),)", "(Shard(dim=1),)"], r["placements"]
    hf_keys = sorted(model().state_dict())
    assert r["keys"] == hf_keys and not any("w_qkv" in k or "w_gu" in k for k in hf_keys)
    # What was written is the Hugging Face state dict: read without any process group, it equals the
    # single-process model's state_dict (HF names and layouts).
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    dcp_to_torch_save(results["out"] / "dcp", tmp_path / "full.pt")
    saved = torch.load(tmp_path / "full.pt", weights_only=True)
    ref = model().state_dict()
    assert sorted(saved) == sorted(ref)
    for k in ref:
        assert torch.equal(saved[k], ref[k]), k


def test_cpu_gloo_patch_llama(results):
    pytest.importorskip("transformers")
    r = get(results, "patch_llama")
    check_equal(r["ddp"])
    check_equal(r["fsdp_root"])
    check_equal(r["fsdp"])


def test_cpu_gloo_patch_qwen3(results):
    r = get(results, "patch_qwen3")
    if "skipped" in r:
        pytest.skip(r["skipped"])
    check_equal(r["ddp"])
    check_equal(r["fsdp_root"])
    check_equal(r["fsdp"])


def test_cpu_gloo_nn_modules(results):
    r = get(results, "nn_modules")
    check_equal(r)
    assert r["state"] == 0.0  # HF names and values, gathered from the shards


# ---- activation checkpointing (one process) ------------------------------------------------------------------------

def test_cpu_checkpoint_around_block_op():
    """torch.utils.checkpoint around coda.ops.block (whose backward overwrites a saved tensor in place): the same
    gradients as without it."""
    from torch.utils.checkpoint import checkpoint
    m = model()
    ids = batch()
    l_ref, g_ref = loss_and_grads(m, ids)
    import coda.models.stack as stack
    block, calls = coda.ops.block, []

    def checkpointed(*args, **kw):
        calls.append(1)
        return checkpoint(block, *args, use_reentrant=False, **kw)

    stack.ops.block = checkpointed  # run_layers calls ops.block through the module
    try:
        l_c, g_c = loss_and_grads(m, ids)
    finally:
        stack.ops.block = block
    assert len(calls) == 2  # 3 layers: two blocks
    check_equal(compared(l_c, g_c, l_ref, g_ref))


def test_cpu_checkpoint_wrapper_and_selective_checkpointing():
    """Per-layer checkpoint_wrapper (full recompute) and torchtitan-style selective checkpointing (CODA's ops'
    outputs saved, the rest recomputed) give the unwrapped model's loss and gradients."""
    from functools import partial

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (apply_activation_checkpointing,
                                                                             checkpoint_wrapper)
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    ids = batch()
    l_ref, g_ref = loss_and_grads(model(), ids)

    seen = set()

    def save_coda_ops(ctx, op, *args, **kwargs):
        if str(op).startswith("coda."):
            seen.add(str(op))
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    sac = partial(checkpoint_wrapper, context_fn=partial(create_selective_checkpoint_contexts, save_coda_ops))
    for wrapper in (checkpoint_wrapper, sac):
        m = model()
        apply_activation_checkpointing(m, checkpoint_wrapper_fn=wrapper,
                                       check_fn=lambda mod: isinstance(mod, LlamaLayer))
        assert not m.model.fused()
        l_c, g_c = loss_and_grads(m, ids)
        assert abs(l_c.item() - l_ref.item()) <= TIGHT * abs(l_ref.item())
        err, name = worst(g_c, g_ref, strip="_checkpoint_wrapped_module.")
        assert err <= TIGHT, (wrapper, name, err)
        assert sorted(m.state_dict()) == sorted(model().state_dict())  # HF names through the wrapper
    assert {"coda.rmsnorm_qkv_rope.default", "coda.swiglu_mlp.default"} <= seen, seen  # the policy saw CODA's ops


@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers 5 renames it activation_checkpointing_enable
def test_cpu_patch_llama_with_gradient_checkpointing_enable(monkeypatch):
    """HF's gradient_checkpointing_enable() (before or after the patch) and checkpoint_wrapper around the decoder
    layers: the patched model then calls its layers one by one, each checkpointed, with the fused model's loss and
    gradients; unpatch_llama gives the layers back their HF forward."""
    pytest.importorskip("transformers")
    import coda.hf as hf
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (apply_activation_checkpointing,
                                                                             checkpoint_wrapper)
    from test_hf import hf_config, random_model
    ref = random_model(hf_config()).double()
    ids = batch()
    l_a, g_a = loss_and_grads(coda.patch_llama(copy.deepcopy(ref)), ids)
    calls = []  # CODA's per-layer forward: once per layer, and once more in the backward when checkpointed
    plain = hf.layer_forward
    monkeypatch.setattr(hf, "layer_forward", lambda *a, **k: calls.append(1) or plain(*a, **k))
    before = copy.deepcopy(ref)
    before.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    after = coda.patch_llama(copy.deepcopy(ref))
    after.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    wrapped = copy.deepcopy(ref)
    apply_activation_checkpointing(wrapped, checkpoint_wrapper_fn=checkpoint_wrapper,
                                   check_fn=lambda mod: type(mod).__name__ == "LlamaDecoderLayer")
    rebuilt = []
    unpatched = hf._Rebuild.__new__
    monkeypatch.setattr(hf._Rebuild, "__new__", lambda cls, *a: rebuilt.append(1) or unpatched(cls, *a))
    old = coda.patch_llama(copy.deepcopy(ref))  # transformers < 4.52 flags the LlamaModel, not its layers
    old.model.gradient_checkpointing = True
    old.model._gradient_checkpointing_func = functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)
    old.train()
    cases = ((coda.patch_llama(before), ""), (after, ""), (coda.patch_llama(wrapped), "_checkpoint_wrapped_module."),
             (old, ""))
    for m, strip in cases:
        calls.clear()
        l_b, g_b = loss_and_grads(m, ids)
        assert len(calls) == 2 * ref.config.num_hidden_layers  # every layer recomputed in the backward
        assert not rebuilt  # inside a checkpoint its hooks keep the tensors: the layout recipes would replace them
        check_equal(compared(l_b, g_b, l_a, g_a, strip))
    coda.unpatch_llama(after)
    assert "forward" not in after.model.layers[0].__dict__


# ---- GPU: world size 1, NCCL -------------------------------------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@requires_gpu
@pytest.mark.parametrize("offload", [False, True])
def test_gpu_fsdp_world_size_one_nccl(offload, tmp_path):
    """fully_shard per layer + root on one GPU (NCCL, world size 1), bf16 parameters in fp32 with bf16 compute and
    fp32 reduction, CPU offload off/on: the loss and gradients match the unsharded model with compute_dtype bf16
    (the same bf16 kernels; only the gradient reduction's dtype and the layer-by-layer path differ), and the state
    dict roundtrip through torch.distributed.checkpoint is exact."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
    import torch.distributed.checkpoint as dcp
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        ids = batch().cuda()
        ref = model(dtype=torch.float32).cuda()
        l_ref, g_ref = loss_and_grads(ref, ids, compute_dtype=torch.bfloat16)
        m = model(dtype=torch.float32).cuda()
        _shard(m, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
               offload_policy=CPUOffloadPolicy() if offload else OffloadPolicy())
        loss, grads = loss_and_grads(m, ids)
        assert abs(loss.item() - l_ref.item()) <= 1e-2 * abs(l_ref.item())
        for n, g in grads.items():
            assert rel_err(g.cuda(), g_ref[n]) <= 5e-2, n
        sd = m.state_dict()
        dcp.save(sd, checkpoint_id=str(tmp_path / "dcp"))
        m2 = model(seed=1, dtype=torch.float32).cuda()
        _shard(m2, offload_policy=CPUOffloadPolicy() if offload else OffloadPolicy())
        sd2 = m2.state_dict()
        dcp.load(sd2, checkpoint_id=str(tmp_path / "dcp"))
        m2.load_state_dict(sd2)
        for (n, p), (_, q) in zip(m.named_parameters(), m2.named_parameters()):
            assert torch.equal(_full(p).cpu(), _full(q).cpu()), n
    finally:
        dist.destroy_process_group()


# ---- python -m coda.train under torchrun ---------------------------------------------------------------------------

def test_cpu_torchrun_train(tmp_path):
    """torchrun --nproc-per-node 2 -m coda.train on the CPU (gloo, FSDP2, CODA's reference path): one progress bar
    and one banner (rank 0), the averaged loss and validation loss logged, and an HF checkpoint written by rank 0."""
    import json
    import subprocess
    import sys

    from conftest import package_env, tiny_corpus
    corpus, env = tiny_corpus(tmp_path), package_env()
    for attempt in (1, 2):
        out = tmp_path / f"run{attempt}"
        r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                            "-m", "coda.train", "--device", "cpu", "--config", "tiny", "--steps", "3", "--batch-size",
                            "2", "--seq-len", "32", "--warmup", "1", "--eval-every", "2", "--eval-batches", "1",
                            "--log-every", "1", "--warmup-timing", "0", "--data", str(corpus), "--out", str(out)],
                           capture_output=True, text=True, timeout=300, env=env)
        # One rerun, only for gloo's teardown abort (a rank's std::terminate after its last collective; once in nine
        # CPU CI runs on 2026-12-05, PyTorch 2.11): any other failure, or the abort twice, fails the test.
        if r.returncode == 0 or attempt == 2 or "terminate called without an active exception" not in r.stderr:
            break
        warnings.warn("coda.train under torchrun: a rank aborted in gloo's teardown; ran it again")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("coda.train: corpus.txt") == 1 and "(2 processes, FSDP2)" in r.stdout, r.stdout
    import re
    assert len(re.findall(r"0/3 \[00:00<\?, \?it/s\][\r\n]", r.stderr)) == 1, r.stderr[-3000:]  # one bar: rank 0's
    (summary,) = json.loads((out / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["tokens_per_step"] == 2 * 2 * 32
    recs = [json.loads(line) for line in (out / "losses_coda.jsonl").read_text().splitlines()]
    assert [r_["step"] for r_ in recs] == [0, 1, 2] and all("val_loss" in recs[i] for i in (0, 2))
    assert recs[-1]["val_loss"] == summary["final_val_loss"] and recs[-1]["loss"] < recs[0]["loss"] + 1.0
    files = {p.name for p in (out / "checkpoint").iterdir()}
    if "model.safetensors" in files:  # transformers installed: save_pretrained
        from safetensors.torch import load_file
        keys = set(load_file(out / "checkpoint" / "model.safetensors"))
        assert "model.layers.1.mlp.gate_proj.weight" in keys and "model.layers.0.self_attn.k_proj.weight" in keys
    else:
        assert "pytorch_model.bin" in files, files


def test_cpu_patch_llama_per_layer_keeps_no_layout_copies(monkeypatch):
    """On the per-layer path (here: a forward hook on each decoder layer) the ops save a recipe instead of the W_qkv
    and W_gu layout copies (counted: one for each per layer), rebuilt in the backward, with unchanged gradients."""
    pytest.importorskip("transformers")
    import coda.hf as hf
    from test_hf import hf_config, random_model
    ref = random_model(hf_config()).double()
    ids = batch()
    l_a, g_a = loss_and_grads(coda.patch_llama(copy.deepcopy(ref)), ids)
    m = coda.patch_llama(copy.deepcopy(ref))
    for layer in m.model.layers:
        layer.register_forward_hook(lambda *a: None)
    rebuilt = []
    unpatched = hf._Rebuild.__new__
    monkeypatch.setattr(hf._Rebuild, "__new__", lambda cls, *a: rebuilt.append(1) or unpatched(cls, *a))
    l_b, g_b = loss_and_grads(m, ids)
    cfg = ref.config
    assert len(rebuilt) >= 2 * cfg.num_hidden_layers  # W_qkv and W_gu of every layer
    check_equal(compared(l_b, g_b, l_a, g_a))
