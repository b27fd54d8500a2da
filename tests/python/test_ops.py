"""coda.ops forward and backward: on the CPU (float64 reference path vs plain PyTorch, autograd wiring, gradcheck)
and on an sm_90 GPU (kernels, PROTOCOL.md acceptance rule against float64 for every output and gradient)."""
import pytest
import torch

import coda
import inputs as I
import plain
from conftest import check_cpu, check_op, check_reduced_loss, requires_gpu

EPS = 1e-5


def _norm_linear_case(seed, M, d, n, lead=()):
    g = I.gen(seed)
    return [I.act(g, *lead, M, d), I.norm(g, d), I.weight(g, n, d)]


def _qkv_case(seed, M, d, hq, hkv, hd, lead=()):
    g = I.gen(seed)
    return [I.act(g, *lead, M, d), I.norm(g, d), I.weight(g, (hq + 2 * hkv) * hd, d), I.positions(g, *lead, M),
            I.inv_freq(hd)]


def _qk_case(seed, M, d, hq, hkv, hd):
    g = I.gen(seed)
    return [I.act(g, M, d), I.norm(g, d), I.weight(g, (hq + 2 * hkv) * hd, d), I.norm(g, hd), I.norm(g, hd),
            I.positions(g, M), I.inv_freq(hd)]


def _mlp_case(seed, M, d, F):
    g = I.gen(seed)
    return [I.act(g, M, d, scale=4.0), I.norm(g, d), I.weight(g, 2 * F, d), I.weight(g, d, F)]


def _block_case(seed, M, d, F, hq, hkv, hd, lead=()):
    g = I.gen(seed)
    return [I.act(g, *lead, M, hq * hd), I.act(g, *lead, M, d, scale=4.0), I.weight(g, d, hq * hd), I.norm(g, d),
            I.weight(g, 2 * F, d), I.weight(g, d, F), I.norm(g, d), I.weight(g, (hq + 2 * hkv) * hd, d),
            I.positions(g, *lead, M), I.inv_freq(hd)]


def _lce_case(seed, M, d, V, ignore=0.2, ignore_index=-100):
    g = I.gen(seed)
    t = torch.randint(0, V, (M,), generator=g)
    t[torch.rand(M, generator=g) < ignore] = ignore_index
    if M > 2:
        t[0], t[1] = 0, V - 1
    return [I.act(g, M, d, scale=3.0), I.norm(g, d), I.weight(g, V, d), t]


def f_norm_linear(x, gm, w):
    return coda.ops.rmsnorm_linear(x, gm, w, EPS)


def p_norm_linear(x, gm, w):
    return plain.rmsnorm_linear(x, gm, w, EPS)


def f_qkv(hq, hkv, hd):
    return lambda x, gm, w, pos, inv: coda.ops.rmsnorm_qkv_rope(x, gm, w, pos, inv, hq, hkv, hd, EPS)


def p_qkv(hq, hkv, hd):
    return lambda x, gm, w, pos, inv: plain.rmsnorm_qkv_rope(x, gm, w, pos, inv, hq, hkv, hd, EPS)


def f_qk(hq, hkv, hd):
    return lambda x, gm, w, qg, kg, pos, inv: coda.ops.rmsnorm_qkv_qk_norm_rope(x, gm, w, qg, kg, pos, inv, hq, hkv,
                                                                                 hd, EPS)


def p_qk(hq, hkv, hd):
    return lambda x, gm, w, qg, kg, pos, inv: plain.rmsnorm_qkv_qk_norm_rope(x, gm, w, qg, kg, pos, inv, hq, hkv, hd,
                                                                              EPS)


def f_mlp(x, gm, wgu, wd):
    return coda.ops.swiglu_mlp(x, gm, wgu, wd, EPS)[0]


def p_mlp(x, gm, wgu, wd):
    return plain.swiglu_mlp(x, gm, wgu, wd, EPS)


def f_block(hq, hkv, hd):
    return lambda *a: coda.ops.block(*a, hq, hkv, hd, EPS)


def p_block(hq, hkv, hd):
    return lambda *a: plain.block(*a, hq, hkv, hd, EPS)


def _block_qk_case(seed, M, d, F, hq, hkv, hd, lead=()):
    """_block_case plus layer i+1's q_norm / k_norm weights (Qwen3)."""
    g = I.gen(seed + 1000)
    return _block_case(seed, M, d, F, hq, hkv, hd, lead) + [I.norm(g, hd), I.norm(g, hd)]


QK_EPS = 0.5  # the QK-norm's own epsilon, far from EPS: a qk_eps wired to eps shows in qkv


def f_block_qk(hq, hkv, hd):
    return lambda *a: coda.ops.block(*a[:10], hq, hkv, hd, EPS, q_gamma=a[10], k_gamma=a[11], qk_eps=QK_EPS)


def p_block_qk(hq, hkv, hd):
    return lambda *a: plain.block(*a[:10], hq, hkv, hd, EPS, a[10], a[11], qk_eps=QK_EPS)


def f_chain(x, gm, wo, wgu, wd):
    """linear_residual_rmsnorm -> swiglu_mlp with the cache from linear_residual_rmsnorm: the ops compose through
    (x, gamma) + cache."""
    x1, h1, r1 = coda.ops.linear_residual_rmsnorm(x[:, :wo.shape[1]], wo, x, gm, EPS)
    return coda.ops.swiglu_mlp(x1, gm, wgu, wd, EPS, cache=(h1, r1))[0]


def p_chain(x, gm, wo, wgu, wd):
    x1 = x[:, :wo.shape[1]] @ wo.T + x
    return plain.swiglu_mlp(x1, gm, wgu, wd, EPS)


def _chain_case(seed, M, d, F):
    g = I.gen(seed)
    return [I.act(g, M, d), I.norm(g, d), I.weight(g, d, d // 2), I.weight(g, 2 * F, d), I.weight(g, d, F)]


# Gradients that sum over all rows (tokens) and are rounded once: conftest.accept's row_sum rule.
ROW_SUMS = ("gamma", "gamma1", "gamma2", "w", "w_qkv", "w_gu", "w_down", "w_o")

CE_OPTIONS = [dict(), dict(reduction="sum"), dict(reduction="none"), dict(label_smoothing=0.1),
              dict(z_loss=1e-3, softcap=15.0), dict(ignore_index=5)]


# ---- CPU: the reference path and the autograd wiring -------------------------------------------------------

@pytest.mark.parametrize("M", [1, 7, 33])
def test_cpu_rmsnorm_linear(M):
    check_cpu(f_norm_linear, p_norm_linear, _norm_linear_case(M, M, 24, 16))


def test_cpu_rmsnorm_linear_batched():
    check_cpu(f_norm_linear, p_norm_linear, _norm_linear_case(3, 5, 16, 8, lead=(2,)))


@pytest.mark.parametrize("hq,hkv,hd", [(2, 1, 64), (2, 2, 128)])
def test_cpu_qkv_rope(hq, hkv, hd):
    check_cpu(f_qkv(hq, hkv, hd), p_qkv(hq, hkv, hd), _qkv_case(4, 9, 32, hq, hkv, hd))


@pytest.mark.parametrize("hq,hkv,hd", [(2, 1, 64), (2, 2, 128), (3, 1, 64)])
def test_cpu_qkv_qk_norm_rope(hq, hkv, hd):
    check_cpu(f_qk(hq, hkv, hd), p_qk(hq, hkv, hd), _qk_case(14, 9, 32, hq, hkv, hd))


def test_cpu_qk_norm_rope_bwd_zdz_reference_matches_the_ops_backward():
    """_reference.qk_norm_rope_bwd_zdz (the CPU twin of the QK-norm + RoPE backward kernel's binding) against the
    op's own backward by float64 autograd (plain.qk_norm_rope_bwd), zdz against (1/d) <z, dz>."""
    from coda import _reference
    g = I.gen(21)
    hq, hkv, hd, M, d = 3, 1, 64, 9, 96
    z = torch.randn(M, (hq + 2 * hkv) * hd, generator=g, dtype=torch.float64)
    dqkv = torch.randn(z.shape, generator=g, dtype=torch.float64)
    qg, kg = I.norm(g, hd).detach(), I.norm(g, hd).detach()
    pos, inv = I.positions(g, M), I.inv_freq(hd)
    dz, zdz, dq, dk = _reference.qk_norm_rope_bwd_zdz(z, dqkv, qg, kg, pos, inv, hq, hkv, hd, 1e-6, d)
    want_dz, want_dq, want_dk = plain.qk_norm_rope_bwd(z, dqkv, qg, kg, pos, inv, hq, hkv, hd, 1e-6, torch.float64)
    for got, want in ((dz, want_dz), (dq, want_dq), (dk, want_dk), (zdz, (z * want_dz).sum(-1) / d)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_cpu_swiglu_mlp():
    check_cpu(f_mlp, p_mlp, _mlp_case(5, 11, 32, 24))


def test_cpu_chain_with_cache():
    check_cpu(f_chain, p_chain, _chain_case(6, 10, 32, 16))


@pytest.mark.parametrize("hq,hkv,hd", [(2, 1, 64), (1, 1, 128)])
def test_cpu_block(hq, hkv, hd):
    check_cpu(f_block(hq, hkv, hd), p_block(hq, hkv, hd), _block_case(7, 6, 32, 16, hq, hkv, hd, lead=(2,)))


@pytest.mark.parametrize("hq,hkv,hd", [(2, 1, 64), (1, 1, 128)])
def test_cpu_block_qk_norm(hq, hkv, hd):
    """The block with layer i+1's QK-norm (block.h version 2): outputs and every gradient, q_gamma's and k_gamma's
    included, against plain PyTorch."""
    check_cpu(f_block_qk(hq, hkv, hd), p_block_qk(hq, hkv, hd), _block_qk_case(8, 6, 32, 16, hq, hkv, hd, lead=(2,)))


def test_cpu_block_qk_norm_arguments():
    b = _block_qk_case(9, 3, 16, 8, 1, 1, 64)
    with pytest.raises(ValueError, match="`q_gamma` and `k_gamma` go together"):
        coda.ops.block(*b[:10], 1, 1, 64, EPS, q_gamma=b[10])
    with pytest.raises(ValueError, match="`k_gamma`"):
        coda.ops.block(*b[:10], 1, 1, 64, EPS, q_gamma=b[10], k_gamma=b[11][:32])
    with pytest.raises(ValueError, match="`qk_eps` must be > 0"):
        coda.ops.block(*b[:10], 1, 1, 64, EPS, q_gamma=b[10], k_gamma=b[11], qk_eps=0.0)


@pytest.mark.parametrize("opts", CE_OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_cpu_linear_cross_entropy(opts):
    case = _lce_case(8, 13, 16, 40, ignore_index=opts.get("ignore_index", -100))
    check_cpu(lambda x, gm, w, t: coda.ops.linear_cross_entropy(x, gm, w, t, EPS, **opts),
              lambda x, gm, w, t: plain.linear_cross_entropy(x, gm, w, t, EPS, **opts), case)


@pytest.mark.parametrize("opts", CE_OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_cpu_cross_entropy(opts):
    g = I.gen(9)
    t = torch.randint(0, 40, (13,), generator=g)
    t[3] = opts.get("ignore_index", -100)
    check_cpu(lambda l, t: coda.ops.cross_entropy(l, t, **opts), lambda l, t: plain.cross_entropy(l, t, **opts),
              [I.act(g, 13, 40, scale=3.0), t])


def test_cpu_block_second_backward_is_refused():
    """The default in-place backward consumes z1: a second backward must fail loudly, never read dz1 as z1."""
    b = _block_case(16, 3, 8, 8, 1, 1, 64)
    x2, qkv = coda.ops.block(*b, 1, 1, 64, EPS)
    loss = x2.sum() + qkv.square().sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="inplace_backward=False"):
        loss.backward()


def test_cpu_eager_fast_path_matches_custom_op():
    """Eager calls skip the custom-op dispatcher (_library._eager); under a dispatch mode the same call goes through
    torch.ops.coda.*. Both must give bit-identical outputs and gradients, and the fast path must not touch the op."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(str(func))
            return func(*args, **(kwargs or {}))

    def run(mode):
        b = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in _block_case(19, 5, 16, 8, 2, 1, 64)]
        b[2:8] = [torch.nn.Parameter(t) for t in b[2:8]]  # weights as a model holds them
        if mode is None:
            x2, qkv = coda.ops.block(*b, 2, 1, 64, EPS)
        else:
            with mode:
                x2, qkv = coda.ops.block(*b, 2, 1, 64, EPS)
        names.append(type(x2.grad_fn.next_functions[0][0]).__name__)  # x2 is a view of the op's output
        (x2.square().sum() + qkv.sum()).backward()
        return [x2, qkv] + [t.grad for t in b if t.is_floating_point()]

    names = []
    seen = Seen()
    via_op = run(seen)
    assert "coda.block_forward.default" in seen.ops
    fast = run(None)
    assert "block_forward_function" not in names[0] and "block_forward_function" in names[1], names
    assert sum(t is not None for t in fast) >= 10  # x2, qkv and the 8 differentiable inputs' gradients
    for a, b in zip(fast, via_op):
        assert (a is None and b is None) or torch.equal(a, b)


def test_cpu_eager_fast_path_hides_internals_from_torch_function_modes():
    """A torch function mode (torch.device(...) as a context, torch.set_default_device) sees a coda op as one call
    through the custom op; the fast path must not expose the op's internals to it (the reference's factory calls
    would land on the mode's device)."""
    x, gm, w, t = _lce_case(24, 7, 16, 24)
    ref = coda.ops.linear_cross_entropy(x, gm, w, t, EPS)
    ref.backward()
    ref_dx, x.grad = x.grad, None
    with torch.device("meta"):
        loss = coda.ops.linear_cross_entropy(x, gm, w, t, EPS)
    loss.backward()
    assert torch.equal(loss, ref) and torch.equal(x.grad, ref_dx)
    with torch.device("meta"), torch.no_grad():
        loss = coda.ops.linear_cross_entropy(x, gm, w, torch.full_like(t, -100), EPS)
    assert loss.device.type == "cpu" and loss.item() == 0.0


def test_cpu_jit_trace_records_the_op():
    """torch.jit.trace records the custom op, as before the fast path: the op's function (a ctypes kernel call on
    CUDA) is invisible to the tracer."""
    x, gm, w = [a.detach() for a in _norm_linear_case(25, 5, 16, 8)]
    traced = torch.jit.trace(f_norm_linear, (x, gm, w))
    assert "coda::rmsnorm_linear" in str(traced.graph)


@pytest.mark.parametrize("reentrant", [False, True])
def test_cpu_checkpoint(reentrant):
    """torch.utils.checkpoint around block + swiglu_mlp (the eager fast path, recomputed in the backward): the same
    gradients as without."""
    def body(*a):
        x2, qkv = coda.ops.block(*a[:10], 1, 1, 64, EPS)
        return coda.ops.swiglu_mlp(x2, a[3], a[4], a[5], EPS)[0], qkv

    def run(ckpt):
        a = [t.detach().requires_grad_(t.requires_grad) for t in _block_case(26, 5, 16, 8, 1, 1, 64)]
        out = torch.utils.checkpoint.checkpoint(body, *a, use_reentrant=reentrant) if ckpt else body(*a)
        (out[0].square().sum() + out[1].sum()).backward()
        return [t.grad for t in a if t.requires_grad]

    assert all(torch.equal(g, r) for g, r in zip(run(True), run(False)))


def test_cpu_zero_tokens():
    """M = 0 (an empty batch) is legal everywhere: empty outputs, zero weight gradients."""
    qkv = _qkv_case(17, 0, 16, 1, 1, 64)
    out = f_qkv(1, 1, 64)(*qkv)
    assert out.shape == (0, 3 * 64)
    b = _block_case(18, 0, 16, 8, 1, 1, 64)
    x2, q = coda.ops.block(*b, 1, 1, 64, EPS)
    (x2.sum() + q.sum()).backward()
    assert x2.shape == (0, 16) and b[2].grad.abs().max().item() == 0.0


def test_cpu_all_rows_ignored():
    x, gm, w, t = _lce_case(10, 5, 16, 24)
    t = torch.full_like(t, -100)
    loss = coda.ops.linear_cross_entropy(x, gm, w, t, EPS)
    loss.backward()
    assert loss.item() == 0.0 and x.grad.abs().max().item() == 0.0 and w.grad.abs().max().item() == 0.0


def test_cpu_gradcheck():
    """torch.autograd.gradcheck (finite differences) on the float64 path of every differentiable op."""
    gc = lambda f, a: torch.autograd.gradcheck(f, a, eps=1e-6, atol=1e-5)  # noqa: E731
    assert gc(f_norm_linear, _norm_linear_case(11, 3, 8, 4))
    qkv = _qkv_case(12, 3, 8, 1, 1, 64)
    assert gc(lambda x, gm, w: f_qkv(1, 1, 64)(x, gm, w, qkv[3], qkv[4]), qkv[:3])
    assert gc(f_mlp, _mlp_case(13, 3, 8, 8))
    b = _block_case(14, 3, 8, 8, 1, 1, 64)
    assert gc(lambda *a: coda.ops.block(*a, b[8], b[9], 1, 1, 64, EPS, inplace_backward=False), b[:8])
    x, gm, w, t = _lce_case(15, 4, 8, 16)
    assert gc(lambda x, gm, w: coda.ops.linear_cross_entropy(x, gm, w, t, EPS, label_smoothing=0.1, z_loss=0.01,
                                                            softcap=5.0), [x, gm, w])
    qk = _qk_case(16, 3, 8, 1, 1, 64)
    assert gc(lambda x, gm, w, qg, kg: f_qk(1, 1, 64)(x, gm, w, qg, kg, qk[5], qk[6]), qk[:5])
    bq = _block_qk_case(17, 3, 8, 8, 1, 1, 64)
    assert gc(lambda *a: coda.ops.block(*a[:8], bq[8], bq[9], 1, 1, 64, EPS, q_gamma=a[8], k_gamma=a[9],
                                        qk_eps=QK_EPS, inplace_backward=False), bq[:8] + bq[10:])
    g = I.gen(18)
    a, w, r = I.act(g, 3, 8), I.weight(g, 6, 8), I.act(g, 3, 6)
    assert gc(lambda a, w, r: coda.ops.linear_residual_rmsnorm(a, w, r, I.norm(g, 6).detach(), EPS)[0], [a, w, r])
    logits = I.act(g, 5, 12, scale=3.0)
    tg = torch.tensor([0, 11, -100, 3, 7])
    assert gc(lambda lg: coda.ops.cross_entropy(lg, tg, label_smoothing=0.1, z_loss=0.01,
                                                softcap=5.0), [logits])


def test_cpu_gradcheck_covers_every_public_op():
    """A new public op joins test_cpu_gradcheck (by name in its source) unless it has no gradient of its own."""
    import inspect
    source = inspect.getsource(test_cpu_gradcheck) + inspect.getsource(f_norm_linear) + inspect.getsource(f_qkv) + \
        inspect.getsource(f_qk) + inspect.getsource(f_mlp)
    no_gradient = {"rmsnorm_prepare"}  # its outputs are a non-differentiable cache (PYTHON.md)
    missing = [op for op in coda.ops.__all__ if op not in no_gradient and f"coda.ops.{op}(" not in source]
    assert not missing, f"public ops without a gradcheck: {missing}"


# ---- GPU: the kernels ------------------------------------------------------------------------------------------

DTYPES = [torch.bfloat16, torch.float16]


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,d,n", [(1, 64, 64), (1000, 264, 128), (4097, 2048, 256), (256, 16, 24), (300, 64, 1003),
                                   (1000, 128, 5)])
def test_gpu_rmsnorm_linear(M, d, n, dtype):
    check_op(f_norm_linear, p_norm_linear, _norm_linear_case(M, M, d, n), dtype, names=["x", "gamma", "w"],
             row_sums=ROW_SUMS)


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,d,hq,hkv,hd", [(7, 128, 2, 1, 64), (1000, 512, 4, 2, 128), (2048, 2048, 32, 8, 64)])
def test_gpu_qkv_rope(M, d, hq, hkv, hd, dtype):
    check_op(f_qkv(hq, hkv, hd), p_qkv(hq, hkv, hd), _qkv_case(M, M, d, hq, hkv, hd), dtype,
             names=["x", "gamma", "w_qkv"], row_sums=ROW_SUMS)


# Widths 256 (2q+1k+1v of 64), 1024, 3072 (llama3-1B's heads) and 320 (3q+1k+1v of 64: a 128-column tile holds a q
# and a k head, the last one v and 64 columns past N); the q/k gammas' gradients sum over rows and heads.
@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,d,hq,hkv,hd", [(7, 128, 2, 1, 64), (1000, 512, 4, 2, 128), (2048, 2048, 32, 8, 64),
                                           (300, 264, 3, 1, 64)])
def test_gpu_qkv_qk_norm_rope(M, d, hq, hkv, hd, dtype):
    check_op(f_qk(hq, hkv, hd), p_qk(hq, hkv, hd), _qk_case(M, M, d, hq, hkv, hd), dtype,
             names=["x", "gamma", "w_qkv", "q_gamma", "k_gamma"], row_sums=ROW_SUMS + ("q_gamma", "k_gamma"))


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,hq,hkv,hd", [(7, 3, 1, 64), (1000, 4, 2, 128), (300, 32, 8, 64)])
def test_gpu_qk_norm_rope_bwd_kernel_matches_the_fp32_backward(M, hq, hkv, hd, dtype):
    """coda_qk_norm_rope_bwd_zdz (the kernel behind the op's autograd) against fp32 PyTorch autograd
    of the same map (plain.qk_norm_rope_bwd) and zdz = (1/d) <z, dz>: the binding's argument order and layout."""
    from coda import _kernels
    g = I.gen(M + hd)
    W = (hq + 2 * hkv) * hd
    z = (2 * torch.randn(M, W, generator=g)).to(dtype).cuda()
    dqkv = torch.randn(M, W, generator=g).to(dtype).cuda()
    qg, kg = I.norm(g, hd).detach().float().cuda(), I.norm(g, hd).detach().float().cuda()
    pos, inv = I.positions(g, M).to(torch.int32).cuda(), I.inv_freq(hd).float().cuda()
    dz, zdz, dqg, dkg = _kernels.qk_norm_rope_bwd_zdz(z, dqkv, qg, kg, pos, inv, hq, hkv, hd, 1e-6, 4096)
    want_dz, want_dqg, want_dkg = plain.qk_norm_rope_bwd(z, dqkv, qg, kg, pos, inv, hq, hkv, hd, 1e-6)
    want_zdz = (z.float() * want_dz.float()).sum(-1) / 4096
    rel = lambda a, b: ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()  # noqa: E731
    assert rel(dz, want_dz) < 1e-2 and rel(zdz, want_zdz) < 1e-2
    assert rel(dqg, want_dqg) < 1e-4 and rel(dkg, want_dkg) < 1e-4
    assert torch.equal(dz[:, (hq + hkv) * hd:], dqkv[:, (hq + hkv) * hd:])


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,d,F", [(1, 64, 64), (1000, 256, 264), (2048, 2048, 8192)])
def test_gpu_swiglu_mlp(M, d, F, dtype):
    check_op(f_mlp, p_mlp, _mlp_case(M, M, d, F), dtype, names=["x", "gamma", "w_gu", "w_down"], row_sums=ROW_SUMS)


@requires_gpu
def test_gpu_chain_with_cache():
    check_op(f_chain, p_chain, _chain_case(6, 777, 256, 512), names=["x", "gamma", "w_o", "w_gu", "w_down"],
             row_sums=ROW_SUMS)


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead,M,d,F,hq,hkv,hd", [((), 1000, 256, 512, 4, 1, 64), ((2,), 512, 2048, 8192, 32, 8, 64),
                                                   ((), 300, 1024, 2816, 8, 8, 128)])
def test_gpu_block(lead, M, d, F, hq, hkv, hd, dtype):
    check_op(f_block(hq, hkv, hd), p_block(hq, hkv, hd), _block_case(M, M, d, F, hq, hkv, hd, lead), dtype,
             names=["y0", "x0", "w_o", "gamma1", "w_gu", "w_down", "gamma2", "w_qkv"], row_sums=ROW_SUMS)


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead,M,d,F,hq,hkv,hd", [((), 1000, 256, 512, 4, 1, 64), ((2,), 300, 1024, 2816, 8, 8, 128)])
def test_gpu_block_qk_norm(lead, M, d, F, hq, hkv, hd, dtype):
    check_op(f_block_qk(hq, hkv, hd), p_block_qk(hq, hkv, hd), _block_qk_case(M, M, d, F, hq, hkv, hd, lead), dtype,
             names=["y0", "x0", "w_o", "gamma1", "w_gu", "w_down", "gamma2", "w_qkv", "q_gamma", "k_gamma"],
             row_sums=ROW_SUMS + ("q_gamma", "k_gamma"))


@requires_gpu
@pytest.mark.parametrize("opts", CE_OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
@pytest.mark.parametrize("M,d,V", [(1000, 256, 32000), (7, 64, 264), (600, 128, 32003), (9, 64, 5)])
def test_gpu_linear_cross_entropy(M, d, V, opts):
    case = _lce_case(M, M, d, V, ignore_index=opts.get("ignore_index", -100))
    reduction = opts.get("reduction", "mean")
    check_op(lambda x, gm, w, t: coda.ops.linear_cross_entropy(x, gm, w, t, EPS, **opts),
             lambda x, gm, w, t: plain.linear_cross_entropy(x, gm, w, t, EPS, **opts), case, names=["x", "gamma", "w"],
             check_outputs=reduction == "none", row_sums=ROW_SUMS)
    if reduction != "none":
        o = {k: v for k, v in opts.items() if k != "reduction"}
        check_reduced_loss(lambda x, gm, w, t, reduction: coda.ops.linear_cross_entropy(x, gm, w, t, EPS,
                                                                                        reduction=reduction, **o),
                           lambda x, gm, w, t, reduction: plain.linear_cross_entropy(x, gm, w, t, EPS,
                                                                                     reduction=reduction, **o),
                           case, reduction)


@requires_gpu
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("M,d,V,chunk", [(300, 128, 1003, 128), (257, 136, 5, 128), (257, 128, 1003, 128)])
def test_gpu_linear_cross_entropy_chunks_odd_vocab(M, d, V, chunk, reduction):
    """The padded-vocabulary LM-head backward over several chunks: dW's 8-row tail accumulated across chunks, a
    last chunk of one row (M = 257), V below 8."""
    case = _lce_case(M, M, d, V)
    opts = dict(reduction=reduction, chunk_rows=chunk)
    check_op(lambda x, gm, w, t: coda.ops.linear_cross_entropy(x, gm, w, t, EPS, **opts),
             lambda x, gm, w, t: plain.linear_cross_entropy(x, gm, w, t, EPS, reduction=reduction), case,
             names=["x", "gamma", "w"], check_outputs=reduction == "none", row_sums=ROW_SUMS)


@requires_gpu
@pytest.mark.parametrize("opts", CE_OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
@pytest.mark.parametrize("V", [50264, 50257])
def test_gpu_cross_entropy(opts, V):
    g = I.gen(21)
    t = torch.randint(0, V, (300,), generator=g)
    t[:20] = opts.get("ignore_index", -100)
    t[20] = V - 1
    case = [I.act(g, 300, V, scale=3.0), t]
    reduction = opts.get("reduction", "mean")
    check_op(lambda l, t: coda.ops.cross_entropy(l, t, **opts), lambda l, t: plain.cross_entropy(l, t, **opts), case,
             names=["logits"], check_outputs=reduction == "none")
    if reduction != "none":
        o = {k: v for k, v in opts.items() if k != "reduction"}
        check_reduced_loss(lambda l, t, reduction: coda.ops.cross_entropy(l, t, reduction=reduction, **o),
                           lambda l, t, reduction: plain.cross_entropy(l, t, reduction=reduction, **o), case,
                           reduction)


@requires_gpu
def test_gpu_all_rows_ignored():
    x, gm, w, t = [a.cuda() if i == 3 else a.detach().cuda().bfloat16().requires_grad_()
                   for i, a in enumerate(_lce_case(22, 100, 64, 256))]
    loss = coda.ops.linear_cross_entropy(x, gm, w, torch.full_like(t, -100), EPS)
    loss.backward()
    assert loss.item() == 0.0 and x.grad.abs().max().item() == 0.0 and w.grad.abs().max().item() == 0.0


@requires_gpu
def test_gpu_deterministic():
    case = [t.detach().cuda().bfloat16().requires_grad_() if t.requires_grad else t.cuda()
            for t in _block_case(23, 999, 256, 512, 4, 2, 64)]
    runs = []
    for _ in range(2):
        outs = f_block(4, 2, 64)(*case)
        grads = torch.autograd.grad(outs[0].float().sum() + outs[1].float().square().sum(),
                                    [t for t in case if t.requires_grad])
        runs.append([o.detach().clone() for o in outs] + list(grads))
    assert all(torch.equal(a, b) for a, b in zip(*runs))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_lm_head_dw_scaled_cast_is_product_then_one_rounding(dtype, monkeypatch):
    """The LM head's backward scales its saved fp32 dW by the upstream gradient and casts in one pass
    (coda.ops._loss._scaled_cast): the same bits as the fp32 product rounded once, on the CPU and (with a GPU) there,
    where eager calls go through coda_scale_cast (counted: torch.mul would give the same bits)."""
    from coda import _kernels
    from coda.ops._loss import _scaled_cast
    calls = []
    real = _kernels.scale_cast
    monkeypatch.setattr(_kernels, "scale_cast", lambda *a: calls.append(1) or real(*a))
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for dev in devices:
        g = torch.Generator(device=dev).manual_seed(7)
        t = torch.randn(5003, 40, generator=g, device=dev) * 300.0
        t.view(-1)[::997] = torch.tensor([float("inf"), -0.0, 1e38, -1e-39], device=dev).repeat(51)[:201]
        # on CUDA: coda_scale_cast's vector path, its scalar path (a view 12 bytes past alignment) and its tail
        for view in (t, t.view(-1)[3:], t.view(-1)[8:-5]):
            for s in (1 / 8192, 0.37, 3.0e-7, -2.5):
                scale = torch.tensor(s, device=dev)
                got, want = _scaled_cast(view, scale, dtype), (view * scale).to(dtype)
                assert got.dtype == dtype and got.shape == view.shape
                assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (dev, s, view.shape)
        # under a create_graph backward the scale carries a gradient: the result must too (same bits)
        scale = torch.tensor(0.37, device=dev, requires_grad=True)
        got = _scaled_cast(t, scale, dtype)
        assert got.requires_grad and torch.equal(got.view(torch.int16), (t * 0.37).to(dtype).view(torch.int16))
    assert len(calls) == (12 if "cuda" in devices else 0)  # 3 views x 4 scales on CUDA; the CPU and autograd: torch


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_gpu)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cross_entropy_huge_logits(device, dtype):
    """Logits of any finite size give torch's finite loss and gradient: the kernel subtracts the row max before
    any scaling, so even 1e20 leaves exp's argument in range. Rows: the huge logit at the target, elsewhere, twice
    (two equal maxima: p = 1/2 each), a huge negative one, and an ordinary row."""
    if device == "cuda" and dtype == torch.float32:
        pytest.skip("the kernels take bf16/fp16 logits")
    g = I.gen(5)
    V = 1003
    logits = I.act(g, 5, V, scale=2.0).detach()
    t = torch.tensor([3, 5, 7, 0, V - 1])
    logits[0, 3] = 1e20
    logits[1, 700] = 1e20
    logits[2, 7] = logits[2, 9] = 1e20
    logits[3, 1] = -1e20
    logits = logits.to(dtype)
    ref_in = logits.double().requires_grad_()
    ref = torch.nn.functional.cross_entropy(ref_in, t, reduction="none")
    ref.sum().backward()
    x = logits.to(device).requires_grad_()
    loss = coda.ops.cross_entropy(x, t.to(device), reduction="none")
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(x.grad.float()).all()
    assert ((loss.double().cpu() - ref).abs() <= 1e-6 * ref.abs() + 1e-5).all(), (loss, ref)
    assert (x.grad.double().cpu() - ref_in.grad).abs().max().item() <= 4e-3


def test_cpu_cache_slices_and_shapes():
    """A cache taken from a longer x and sliced like x (h[:, -1:], rstd[:, -1:]), or given flat ([M, d], [M] or
    [M, 1]), is accepted and gives the uncached result; a cache of another x's shape is refused naming `cache`."""
    g = I.gen(3)
    x, gm, w = I.act(g, 2, 9, 16).detach(), (1 + 0.1 * I.act(g, 16)).detach(), I.weight(g, 24, 16).detach()
    h, rstd = coda.ops.rmsnorm_prepare(x, gm, EPS)
    want = coda.ops.rmsnorm_linear(x[:, -1:], gm, w, EPS)
    for cache in ((h[:, -1:], rstd[:, -1:]), (h[:, -1:].reshape(2, 16), rstd[:, -1:].reshape(2)),
                  (h[:, -1:].reshape(2, 16), rstd[:, -1:].reshape(2, 1))):
        got = coda.ops.rmsnorm_linear(x[:, -1:], gm, w, EPS, cache=cache)
        assert got.shape == (2, 1, 24) and (got - want).abs().max().item() <= 1e-12
    with pytest.raises(ValueError, match="`cache`"):
        coda.ops.rmsnorm_linear(x[:, -1:], gm, w, EPS, cache=(h, rstd))


def test_cpu_fp16_mean_loss_takes_the_sum_path(monkeypatch):
    """fp16 training with a mean loss runs the one-pass LM head on the sum's gradients and divides by the count of
    non-ignored rows (fp16's range: see ops.linear_cross_entropy), bf16 on the mean's: the loss and gradients equal
    the float64 mean's to fp16 accuracy, and a loss scaler's factor reaches the gradients unchanged."""
    from coda.ops import _loss
    reductions, train = [], _loss.linear_cross_entropy_train_op
    monkeypatch.setattr(_loss, "linear_cross_entropy_train_op",
                        lambda *a: reductions.append(a[7]) or train(*a))
    g = I.gen(11)
    x, gm, w = (a.detach().requires_grad_() for a in (I.act(g, 37, 16), 1 + 0.1 * I.act(g, 16), I.weight(g, 40, 16)))
    t = torch.randint(0, 40, (37,), generator=g)
    t[:5] = -100
    want = plain.linear_cross_entropy(x, gm, w, t, EPS)
    want.backward()
    ref = [a.grad.clone() for a in (x, gm, w)]
    for scale in (1.0, 4096.0):
        xs, gs, ws = (a.detach().half().requires_grad_() for a in (x, gm, w))
        loss = coda.ops.linear_cross_entropy(xs, gs, ws, t, EPS)
        assert abs(loss.item() - want.item()) <= 1e-3 * abs(want.item())
        (loss * scale).backward()
        for a, r in zip((xs, gs, ws), ref):
            assert (a.grad.double() / scale - r).abs().max().item() <= 2e-3 * r.abs().max().item()
    assert reductions == ["sum", "sum"]
    coda.ops.linear_cross_entropy(*(a.detach().bfloat16().requires_grad_() for a in (x, gm, w)), t, EPS)
    assert reductions[-1] == "mean"


def test_old_rms_norm_names_warn_and_forward():
    """rms_norm_linear & co. (the names before the ops took the C ABI's `rmsnorm`) still run, with a
    DeprecationWarning naming the new name, and give the renamed op's result."""
    g = I.gen(5)
    x, gm, w = torch.randn(3, 8, generator=g, dtype=torch.float64), I.norm(g, 8), torch.randn(4, 8, generator=g,
                                                                                                dtype=torch.float64)
    with pytest.warns(DeprecationWarning, match="renamed coda.ops.rmsnorm_linear"):
        old = coda.ops.rms_norm_linear(x, gm, w)
    torch.testing.assert_close(old, coda.ops.rmsnorm_linear(x, gm, w), rtol=0, atol=0)
    assert coda.ops.rms_norm_qkv_rope.__name__ == "rms_norm_qkv_rope"
    assert coda.ops.rms_norm_qkv_qk_norm_rope.__wrapped__ is coda.ops.rmsnorm_qkv_qk_norm_rope
