"""torch.compile(fullgraph=True) traces every coda op (forward and the backward graph) with no graph break and
matches eager."""
import pytest
import torch

import coda
import inputs as I
from conftest import requires_gpu

EPS = 1e-5


def every_op(y0, x0, w_o, g1, w_gu, w_down, g2, w_qkv, positions, inv_freq, w_head, targets, q_gamma, k_gamma):
    hq, hkv, hd = 2, 1, 64
    h, r = coda.ops.rmsnorm_prepare(x0, g1, EPS)
    qkv0 = coda.ops.rmsnorm_qkv_rope(x0, g1, w_qkv, positions, inv_freq, hq, hkv, hd, EPS, cache=(h, r))
    qkv1 = coda.ops.rmsnorm_qkv_qk_norm_rope(x0, g1, w_qkv, q_gamma, k_gamma, positions, inv_freq, hq, hkv, hd,
                                              EPS, cache=(h, r))
    x2, qkv = coda.ops.block(y0 + qkv0[..., : y0.shape[-1]] + qkv1[..., : y0.shape[-1]], x0, w_o, g1, w_gu, w_down,
                             g2, w_qkv, positions, inv_freq, hq, hkv, hd, EPS)
    x3, h3, r3 = coda.ops.linear_residual_rmsnorm(qkv[..., : y0.shape[-1]], w_o, x2, g1, EPS)
    x4, cache = coda.ops.swiglu_mlp(x3, g1, w_gu, w_down, EPS, cache=(h3, r3), next_gamma=g2)
    logits = coda.ops.rmsnorm_linear(x4, g2, w_head, EPS, cache=cache)
    return (coda.ops.linear_cross_entropy(x4, g2, w_head, targets, EPS, cache=cache)
            + coda.ops.cross_entropy(logits, targets, label_smoothing=0.1))


def case(device, dtype, M=24, d=64, F=64, V=128):
    g = I.gen(3)
    hq, hkv, hd = 2, 1, 64
    t = [I.act(g, M, hq * hd), I.act(g, M, d), I.weight(g, d, hq * hd), I.norm(g, d), I.weight(g, 2 * F, d),
         I.weight(g, d, F), I.norm(g, d), I.weight(g, (hq + 2 * hkv) * hd, d), I.positions(g, M), I.inv_freq(hd),
         I.weight(g, V, d), torch.randint(0, V, (M,), generator=g), I.norm(g, hd), I.norm(g, hd)]
    return [x.detach().to(device=device, dtype=dtype if x.is_floating_point() and i != 9 else x.dtype)
            .requires_grad_(x.requires_grad) for i, x in enumerate(t)]


def compare(device, dtype, tol):
    torch._dynamo.reset()
    eager_in, comp_in = case(device, dtype), case(device, dtype)
    loss_e = every_op(*eager_in)
    loss_e.backward()
    compiled = torch.compile(every_op, fullgraph=True)
    loss_c = compiled(*comp_in)
    loss_c.backward()
    assert torch.allclose(loss_c, loss_e, rtol=tol, atol=tol), (loss_c.item(), loss_e.item())
    for a, b in zip(comp_in, eager_in):
        if a.requires_grad:
            assert torch.allclose(a.grad.float(), b.grad.float(), rtol=tol, atol=tol * b.grad.abs().max().item())


def test_cpu_compile_fullgraph():
    compare("cpu", torch.float64, 1e-10)


def test_every_public_op_is_compiled():
    """every_op is written by hand: a new public op must join it."""
    import inspect
    source = inspect.getsource(every_op)
    missing = [op for op in coda.ops.__all__ if f"coda.ops.{op}(" not in source]
    assert not missing, f"public ops missing from every_op: {missing}"


@requires_gpu
def test_gpu_compile_fullgraph():
    compare("cuda", torch.bfloat16, 2e-2)
