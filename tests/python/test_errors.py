"""Bad input gets a clear Python error naming the argument and the rule, before any kernel runs (PROTOCOL.md)."""
import pytest
import torch

import coda
from conftest import requires_gpu


def _t(*shape, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape, dtype=dtype, device=device)


@pytest.mark.parametrize("call,exc,match", [
    (lambda: coda.ops.rms_norm_linear([1.0], _t(8), _t(4, 8)), TypeError, "`x` must be a torch.Tensor"),
    (lambda: coda.ops.rms_norm_linear(_t(3, 8), _t(7), _t(4, 8)), ValueError, "`gamma` dimension 0"),
    (lambda: coda.ops.rms_norm_linear(_t(3, 8), _t(8), _t(4, 7)), ValueError, "`w` dimension 1"),
    (lambda: coda.ops.rms_norm_linear(_t(3, 8), _t(8), _t(4, 8, dtype=torch.float64)), TypeError, "`w` has dtype"),
    (lambda: coda.ops.rms_norm_linear(_t(3, 8), _t(8), _t(4, 8), eps=0.0), ValueError, "`eps` must be > 0"),
    (lambda: coda.ops.rms_norm_linear(_t(3, 8).int(), _t(8), _t(4, 8)), TypeError, "floating point"),
    (lambda: coda.ops.rms_norm_linear(_t(3, 8), _t(8), _t(4, 8), cache=(_t(2, 8), _t(2))), ValueError, "cache"),
    (lambda: coda.ops.rms_norm_qkv_rope(_t(3, 8), _t(8), _t(4 * 64, 8), torch.zeros(3, dtype=torch.long), _t(32),
                                        2, 1, 48), ValueError, "`head_dim` must be 64 or 128"),
    (lambda: coda.ops.rms_norm_qkv_rope(_t(3, 8), _t(8), _t(4 * 64, 8), torch.zeros(3, dtype=torch.long), _t(32),
                                        3, 2, 64), ValueError, "`n_kv_heads`"),
    (lambda: coda.ops.rms_norm_qkv_rope(_t(3, 8), _t(8), _t(5 * 64, 8), torch.zeros(3, dtype=torch.long), _t(32),
                                        2, 1, 64), ValueError, "`w_qkv` must have"),
    (lambda: coda.ops.rms_norm_qkv_rope(_t(3, 8), _t(8), _t(4 * 64, 8), torch.zeros(4, dtype=torch.long), _t(32),
                                        2, 1, 64), ValueError, "`positions` must have shape"),
    (lambda: coda.ops.rms_norm_qkv_rope(_t(3, 8), _t(8), _t(4 * 64, 8), _t(3), _t(32), 2, 1, 64), TypeError,
     "`positions` must have dtype"),
    (lambda: coda.ops.swiglu_mlp(_t(3, 8), _t(8), _t(12, 8), _t(8, 5)), ValueError, "`w_down` must be"),
    (lambda: coda.ops.linear_cross_entropy(_t(3, 8), _t(8), _t(16, 8), torch.zeros(4, dtype=torch.long)),
     ValueError, "`targets` must have shape"),
    (lambda: coda.ops.linear_cross_entropy(_t(3, 8), _t(8), _t(16, 8), torch.zeros(3, dtype=torch.long),
                                           reduction="avg"), ValueError, "`reduction` must be one of"),
    (lambda: coda.ops.linear_cross_entropy(_t(3, 8), _t(8), _t(16, 8), torch.zeros(3, dtype=torch.long),
                                           label_smoothing=1.5), ValueError, "`label_smoothing`"),
    (lambda: coda.ops.cross_entropy(_t(3, 8), torch.zeros(3, dtype=torch.long), z_loss=-1.0), ValueError,
     "`z_loss`"),
    (lambda: coda.ops.cross_entropy(_t(3, 8), _t(3)), TypeError, "`targets` must have dtype"),
    (lambda: coda.layout.pair_rope_rows(_t(10, 4), 4), ValueError, "head_dim"),
    (lambda: coda.ops.rms_norm_linear(_t(3, 8), _t(8), _t(4, 8), eps="a"), TypeError, "`eps` must be a number"),
    (lambda: coda.ops.rms_norm_linear(_t(3, 8), _t(8), _t(4, 8), cache=(_t(3, 8), torch.ones(3, dtype=torch.int32))),
     TypeError, "rstd"),
    (lambda: coda.ops.rms_norm_linear(_t(3, 8), _t(8), _t(4, 8), cache=(_t(3, 8), _t(3).requires_grad_())),
     ValueError, "must not require grad"),
    (lambda: coda.ops.rms_norm_linear(_t(3, 8), _t(8), _t(4, 8), cache=(_t(3, 8, dtype=torch.float64), _t(3))),
     TypeError, "cache\\[0\\]"),
    (lambda: coda.ops.cross_entropy(_t(3, 8), torch.zeros(3, dtype=torch.long), label_smoothing="0.1"), TypeError,
     "`label_smoothing` must be a number"),
    (lambda: coda.ops.block(_t(2, 64), _t(2, 64), _t(64, 64), _t(64), _t(128, 64), _t(64, 64), _t(64), _t(192, 64),
                            [0, 1], _t(32), 1, 1, 64), TypeError, "`positions` must be a torch.Tensor"),
])
def test_python_checks(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_block_checks_after_a_passing_call():
    """ops.block skips its Python checks for an argument signature that passed them last time (its host-time cache);
    any change of shape, dtype, device, type or scalar is checked again."""
    hq, hkv, hd, d, F, M = 1, 1, 64, 64, 64, 2
    args = [_t(M, hq * hd), _t(M, d), _t(d, hq * hd), _t(d), _t(2 * F, d), _t(d, F), _t(d), _t((hq + 2 * hkv) * hd, d),
            torch.arange(M), _t(hd // 2), hq, hkv, hd]
    coda.ops.block(*args)
    coda.ops.block(*args)  # the cached signature
    bad = list(args)
    bad[8] = torch.arange(M + 1)
    with pytest.raises(ValueError, match="`positions` must have shape"):
        coda.ops.block(*bad)
    with pytest.raises(ValueError, match="`eps` must be > 0"):
        coda.ops.block(*args, -1.0)
    bad = list(args)
    bad[6] = _t(d, dtype=torch.float64)
    with pytest.raises(TypeError, match="`gamma2` has dtype"):
        coda.ops.block(*bad)
    coda.ops.block(*args)  # and back


def test_block_check_cache_is_not_used_while_tracing():
    """make_fx traces with fake tensors and symbolic shapes: ops.block neither stores nor compares their signature
    (a stored SymInt outlived its trace and failed the next one; compared, it specialised the next trace's shapes)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    hq, hkv, hd, d, F, M = 1, 1, 64, 64, 64, 3
    inputs = (_t(M, hq * hd), _t(M, d), _t(d, hq * hd), _t(d), _t(2 * F, d), _t(d, F), _t(d),
              _t((hq + 2 * hkv) * hd, d), torch.arange(M), _t(hd // 2))

    def f(*tensors):
        return coda.ops.block(*tensors, hq, hkv, hd)

    f(*inputs)  # an eager call stores its signature
    stored = coda.ops._block_checked[0]
    make_fx(f, tracing_mode="fake")(*inputs)
    assert coda.ops._block_checked[0] == stored  # nothing stored from the trace
    for _ in range(2):
        g = make_fx(f, tracing_mode="symbolic")(*inputs)
        y0 = next(n for n in g.graph.nodes if n.op == "placeholder").meta["val"]
        assert isinstance(y0.shape[0], torch.SymInt), f"the symbolic trace was specialised: {y0.shape}"
    assert coda.ops._block_checked[0] == stored


@requires_gpu
def test_gpu_device_mismatch_and_dtype():
    x, g, w = _t(3, 64, dtype=torch.bfloat16, device="cuda"), _t(64, dtype=torch.bfloat16), \
        _t(64, 64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="`gamma` is on cpu"):
        coda.ops.rms_norm_linear(x, g, w)
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        coda.ops.rms_norm_linear(x.float(), g.cuda().float(), w.float())


@requires_gpu
def test_gpu_library_errors_name_the_argument():
    """Rules only the library checks (alignment, TMA strides) come back with its message; outputs untouched."""
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(5, 12, dtype=bf, device=dev)  # 12 features: rows not 16-byte aligned for TMA
    with pytest.raises(ValueError, match="coda_"):
        coda.ops.rms_norm_linear(x, torch.ones(12, dtype=bf, device=dev), torch.randn(16, 12, dtype=bf, device=dev))
