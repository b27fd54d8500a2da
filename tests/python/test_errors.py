"""Bad input gets a clear Python error naming the argument and the rule, before any kernel runs (PROTOCOL.md)."""
import ctypes

import pytest
import torch

import coda
from conftest import requires_gpu


def _t(*shape, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape, dtype=dtype, device=device)


@pytest.mark.parametrize("call,exc,match", [
    (lambda: coda.ops.rmsnorm_linear([1.0], _t(8), _t(4, 8)), TypeError, "`x` must be a torch.Tensor"),
    (lambda: coda.ops.rmsnorm_linear(_t(3, 8), _t(7), _t(4, 8)), ValueError, "`gamma` dimension 0"),
    (lambda: coda.ops.rmsnorm_linear(_t(3, 8), _t(8), _t(4, 7)), ValueError, "`w` dimension 1"),
    (lambda: coda.ops.rmsnorm_linear(_t(3, 8), _t(8), _t(4, 8, dtype=torch.float64)), TypeError, "`w` has dtype"),
    (lambda: coda.ops.rmsnorm_linear(_t(3, 8), _t(8), _t(4, 8), eps=0.0), ValueError, "`eps` must be > 0"),
    (lambda: coda.ops.rmsnorm_linear(_t(3, 8).int(), _t(8), _t(4, 8)), TypeError, "floating point"),
    (lambda: coda.ops.rmsnorm_linear(_t(3, 8), _t(8), _t(4, 8), cache=(_t(2, 8), _t(2))), ValueError, "cache"),
    (lambda: coda.ops.rmsnorm_qkv_rope(_t(3, 8), _t(8), _t(4 * 64, 8), torch.zeros(3, dtype=torch.long), _t(32),
                                        2, 1, 48), ValueError, "`head_dim` must be 64 or 128"),
    (lambda: coda.ops.rmsnorm_qkv_rope(_t(3, 8), _t(8), _t(4 * 64, 8), torch.zeros(3, dtype=torch.long), _t(32),
                                        3, 2, 64), ValueError, "`n_kv_heads`"),
    (lambda: coda.ops.rmsnorm_qkv_rope(_t(3, 8), _t(8), _t(5 * 64, 8), torch.zeros(3, dtype=torch.long), _t(32),
                                        2, 1, 64), ValueError, "`w_qkv` must have"),
    (lambda: coda.ops.rmsnorm_qkv_rope(_t(3, 8), _t(8), _t(4 * 64, 8), torch.zeros(4, dtype=torch.long), _t(32),
                                        2, 1, 64), ValueError, "`positions` must have shape"),
    (lambda: coda.ops.rmsnorm_qkv_rope(_t(3, 8), _t(8), _t(4 * 64, 8), _t(3), _t(32), 2, 1, 64), TypeError,
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
    # NaN and inf scalars: refused on the CPU path as libcoda refuses them on CUDA (not a NaN loss)
    (lambda: coda.ops.cross_entropy(_t(3, 8), torch.zeros(3, dtype=torch.long), z_loss=float("nan")), ValueError,
     "`z_loss` must be >= 0 and finite"),
    (lambda: coda.ops.cross_entropy(_t(3, 8), torch.zeros(3, dtype=torch.long), softcap=float("inf")), ValueError,
     "`softcap` must be >= 0 and finite"),
    (lambda: coda.ops.rmsnorm_linear(_t(3, 8), _t(8), _t(4, 8), eps=float("inf")), ValueError,
     "`eps` must be > 0 and finite"),
    (lambda: coda.ops.cross_entropy(_t(3, 8), _t(3)), TypeError, "`targets` must have dtype"),
    (lambda: coda.ops.rmsnorm_qkv_qk_norm_rope(*_qkv_args()[:3], _t(32), _t(64), *_qkv_args()[3:]), ValueError,
     "`q_gamma` dimension 0"),
    (lambda: coda.ops.rmsnorm_qkv_qk_norm_rope(*_qkv_args()[:3], _t(64), _t(64), *_qkv_args()[3:],
                                               qk_eps=float("nan")), ValueError, "`qk_eps` must be > 0 and finite"),
    (lambda: coda.layout.pair_rope_rows(_t(10, 4), 4), ValueError, "head_dim"),
    (lambda: coda.ops.rmsnorm_linear(_t(3, 8), _t(8), _t(4, 8), eps="a"), TypeError, "`eps` must be a number"),
    (lambda: coda.ops.rmsnorm_linear(_t(3, 8), _t(8), _t(4, 8), cache=(_t(3, 8), torch.ones(3, dtype=torch.int32))),
     TypeError, "rstd"),
    (lambda: coda.ops.rmsnorm_linear(_t(3, 8), _t(8), _t(4, 8), cache=(_t(3, 8), _t(3).requires_grad_())),
     ValueError, "must not require grad"),
    (lambda: coda.ops.rmsnorm_linear(_t(3, 8), _t(8), _t(4, 8), cache=(_t(3, 8, dtype=torch.float64), _t(3))),
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
    stored = coda.ops._block._block_checked[0]
    make_fx(f, tracing_mode="fake")(*inputs)
    assert coda.ops._block._block_checked[0] == stored  # nothing stored from the trace
    for _ in range(2):
        g = make_fx(f, tracing_mode="symbolic")(*inputs)
        y0 = next(n for n in g.graph.nodes if n.op == "placeholder").meta["val"]
        assert isinstance(y0.shape[0], torch.SymInt), f"the symbolic trace was specialised: {y0.shape}"
    assert coda.ops._block._block_checked[0] == stored


@requires_gpu
def test_gpu_device_mismatch_and_dtype():
    x, g, w = _t(3, 64, dtype=torch.bfloat16, device="cuda"), _t(64, dtype=torch.bfloat16), \
        _t(64, 64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="`gamma` is on cpu"):
        coda.ops.rmsnorm_linear(x, g, w)
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        coda.ops.rmsnorm_linear(x.float(), g.cuda().float(), w.float())


@requires_gpu
def test_gpu_library_errors_name_the_argument():
    """Rules only the library checks (alignment, TMA strides) come back with its message; outputs untouched."""
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(5, 12, dtype=bf, device=dev)  # 12 features: rows not 16-byte aligned for TMA
    with pytest.raises(ValueError, match="coda_"):
        coda.ops.rmsnorm_linear(x, torch.ones(12, dtype=bf, device=dev), torch.randn(16, 12, dtype=bf, device=dev))


# ---- issue 24, item 6: errors name the argument the caller passed, and the public op ---------------------------

def _qkv_args(x=None, gamma=None, w_qkv=None):
    x = _t(3, 8) if x is None else x
    return (x, _t(8) if gamma is None else gamma, _t(4 * 64, 8) if w_qkv is None else w_qkv,
            torch.zeros(3, dtype=torch.long), _t(32), 2, 1, 64)


def _block_args(d=64, F=64, M=2, **over):
    hq, hkv, hd = 1, 1, 64
    args = dict(y0=_t(M, hq * hd), x0=_t(M, d), w_o=_t(d, hq * hd), gamma1=_t(d), w_gu=_t(2 * F, d), w_down=_t(d, F),
                gamma2=_t(d), w_qkv=_t((hq + 2 * hkv) * hd, d), positions=torch.arange(M), inv_freq=_t(hd // 2),
                n_q_heads=hq, n_kv_heads=hkv, head_dim=hd)
    args.update(over)
    return args


@pytest.mark.parametrize("call,exc,match", [
    (lambda: coda.ops.rmsnorm_qkv_rope(*_qkv_args(w_qkv=_t(4 * 64, 7))), ValueError,
     "^coda.rmsnorm_qkv_rope: `w_qkv` dimension 1 must equal x's last dimension"),
    (lambda: coda.ops.rmsnorm_qkv_rope(*_qkv_args(w_qkv=_t(4 * 64, 8, dtype=torch.float64))), TypeError,
     "^coda.rmsnorm_qkv_rope: `w_qkv` has dtype"),
    (lambda: coda.ops.rmsnorm_qkv_rope(*_qkv_args(w_qkv=_t(4 * 64))), ValueError,
     "^coda.rmsnorm_qkv_rope: `w_qkv` must have rank 2"),
    (lambda: coda.ops.swiglu_mlp(_t(3, 8), _t(8), _t(12, 7), _t(8, 6)), ValueError,
     "^coda.swiglu_mlp: `w_gu` dimension 1"),
    (lambda: coda.ops.swiglu_mlp(_t(3, 8), _t(8), _t(12, 8).int(), _t(8, 6)), TypeError,
     "^coda.swiglu_mlp: `w_gu` must be floating point"),
    (lambda: coda.ops.block(**_block_args(gamma1=_t(63))), ValueError,
     "^coda.block: `gamma1` dimension 0 must equal x0's last dimension"),
    (lambda: coda.ops.block(**_block_args(gamma1=_t(64, dtype=torch.float64))), TypeError,
     "^coda.block: `gamma1` has dtype"),
    (lambda: coda.ops.block(**_block_args(x0=[1.0])), TypeError, "^coda.block: `x0` must be a torch.Tensor"),
    (lambda: coda.ops.block(**_block_args(x0=torch.tensor(1.0))), ValueError,
     "^coda.block: `x0` must have a feature dimension"),
    (lambda: coda.ops.block(**_block_args(w_gu=_t(128, 63))), ValueError,
     "^coda.block: `w_gu` dimension 1 must equal x0's"),
    (lambda: coda.ops.block(**_block_args(w_gu=_t(128))), ValueError, "^coda.block: `w_gu` must have rank 2"),
])
def test_python_checks_name_the_callers_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def _raise_library_error(monkeypatch, function, message, status=5):
    """Makes the CPU path's `function` fail as the C library would (coda._C.call's exception), to check how the
    public ops report a library error without a GPU."""
    def fail(*args, **kwargs):
        raise coda._C.error(status, function, message)
    monkeypatch.setattr(coda._reference, function, fail)


_LCE = dict(targets=torch.zeros(3, dtype=torch.long))


def _cache():
    return coda.ops.rmsnorm_prepare(_t(3, 8), _t(8))


# Valid calls of the public ops (on the CPU path; the library error is injected by _raise_library_error).
def _swiglu(**kw):
    return coda.ops.swiglu_mlp(_t(3, 8), _t(8), _t(12, 8), _t(8, 6), **kw)


def _rmsnorm_linear(**kw):
    return coda.ops.rmsnorm_linear(_t(3, 8), _t(8), _t(4, 8), **kw)


def _qkv():
    return coda.ops.rmsnorm_qkv_rope(*_qkv_args())


def _block():
    return coda.ops.block(**_block_args())


def _qk(**kw):
    x, gamma, w_qkv, positions, inv_freq, hq, hkv, hd = _qkv_args()
    return coda.ops.rmsnorm_qkv_qk_norm_rope(x, gamma, w_qkv, _t(64), _t(64), positions, inv_freq, hq, hkv, hd, **kw)


def _block_qk():
    return coda.ops.block(**_block_args(), q_gamma=_t(64), k_gamma=_t(64))


def _lce(x=None):
    return coda.ops.linear_cross_entropy(_t(3, 8) if x is None else x, _t(8), _t(16, 8), **_LCE)


# (public op call, the C function that fails, its message, what the op must say)
_LIBRARY_CASES = [
    (_swiglu, "linear_residual_rmsnorm",
     "w: strides[0] = 12 elements (24 bytes) is not a multiple of 16 bytes (TMA rule: 8 elements for bf16)",
     "coda.swiglu_mlp: `w_down`: strides\\[0\\] = 12 elements"),
    (_swiglu, "linear_residual_rmsnorm",
     "gamma: sizes[0] (N) must be 8 as given by w.sizes[0], got 6 (shape [6])",
     "coda.swiglu_mlp: `next_gamma`: sizes\\[0\\] \\(N\\) must be 8 as given by `w_down`.shape\\[0\\], got 6"),
    (_swiglu, "linear_residual_rmsnorm",
     "residual: must be row-major (strides[1] == 1), got strides [1,3]; pass a contiguous tensor",
     "coda.swiglu_mlp: `x`: must be row-major .*; pass a contiguous tensor"),
    (_swiglu, "linear_residual_rmsnorm",
     "w: dtype fp16 must match a (bf16)", "coda.swiglu_mlp: `w_down`: dtype fp16 must match a \\(bf16\\)"),
    (_swiglu, "linear_rowscale_swiglu",
     "w_gu: data pointer 0x7f0000000002 is not 16-byte aligned (TMA rule)", "coda.swiglu_mlp: `w_gu`: data pointer"),
    (lambda: _swiglu(cache=_cache()), "linear_rowscale_swiglu",
     "h: must be row-major (strides[1] == 1)", "coda.swiglu_mlp: `cache\\[0\\] \\(h\\)`: must be row-major"),
    (_swiglu, "rmsnorm_prepare",
     "x: must be row-major (strides[1] == 1)", "coda.swiglu_mlp: `x`: must be row-major"),
    (_rmsnorm_linear, "linear_rowscale",
     "w: must be row-major (strides[1] == 1)", "coda.rmsnorm_linear: `w`: must be row-major"),
    (lambda: _rmsnorm_linear(cache=_cache()), "linear_rowscale",
     "rstd: must be contiguous (dense row-major)", "coda.rmsnorm_linear: `cache\\[1\\] \\(rstd\\)`: must be"),
    (_rmsnorm_linear, "rmsnorm_prepare",
     "gamma: must be contiguous (dense row-major)", "coda.rmsnorm_linear: `gamma`: must be contiguous"),
    (_qkv, "linear_rowscale_rope",
     "w_qkv: strides[0] = 9 elements (18 bytes) is not a multiple of 16 bytes", "coda.rmsnorm_qkv_rope: `w_qkv`:"),
    (_qkv, "linear_rowscale_rope",
     "inv_freq: must be contiguous (dense row-major)", "coda.rmsnorm_qkv_rope: `inv_freq`: must be contiguous"),
    (lambda: coda.ops.linear_residual_rmsnorm(_t(3, 8), _t(8, 8), _t(3, 8), _t(8)), "linear_residual_rmsnorm",
     "residual: row stride 4 is smaller than the row length 8 (rows would overlap)",
     "coda.linear_residual_rmsnorm: `residual`: row stride 4"),
    (lambda: coda.ops.rmsnorm_prepare(_t(3, 8), _t(8)), "rmsnorm_prepare",
     "x: sizes[1] = 12 is not a multiple of 8 elements (16 bytes of bf16, TMA rule); pad the feature dimension",
     "coda.rmsnorm_prepare: `x`: sizes\\[1\\] = 12 is not a multiple of 8 elements"),
    (_block, "block_forward",
     "weights.w_down: must be row-major (strides[1] == 1), got strides [1,64]; pass a contiguous tensor",
     "coda.block: `w_down`: must be row-major"),
    (_block, "block_forward",
     "weights.gamma1: must be contiguous (dense row-major); strides[0] = 2 but 1 expected for shape [64]",
     "coda.block: `gamma1`: must be contiguous"),
    (_block, "block_forward",
     "x0: sizes[0] (M = y0.sizes[0]) must be 2 as given by y0, got 3 (shape [3,64])",
     "coda.block: `x0`: sizes\\[0\\] \\(M = `y0`.shape\\[0\\]\\) must be 2 as given by `y0`, got 3"),
    (_block, "block_forward",
     "config.hidden_size: must be a positive multiple of 8, got 12", "coda.block: `x0.shape\\[-1\\]`: must be a"),
    (_block, "block_forward",
     "step linear_residual_rmsnorm (out-projection + residual + RMSNorm 1) failed: coda_linear_residual_rmsnorm: w: "
     "internal", "coda.block: step linear_residual_rmsnorm .* failed: coda_linear_residual_rmsnorm: w: internal"),
    (_qk, "linear_rowscale_qk_norm_rope",
     "k_gamma: must be contiguous (dense row-major)", "coda.rmsnorm_qkv_qk_norm_rope: `k_gamma`: must be contiguous"),
    (lambda: _qk(cache=_cache()), "linear_rowscale_qk_norm_rope",
     "rstd: must be contiguous (dense row-major)", "coda.rmsnorm_qkv_qk_norm_rope: `cache\\[1\\] \\(rstd\\)`: must be"),
    (_qk, "linear_rowscale_qk_norm_rope",
     "qk_eps: must be finite and > 0, got inf", "coda.rmsnorm_qkv_qk_norm_rope: `qk_eps`: must be finite"),
    (_block_qk, "block_forward",
     "weights.q_gamma: data pointer 0x7f0000000004 is not 8-byte aligned", "coda.block: `q_gamma`: data pointer"),
    (_block_qk, "block_forward",
     "config.qk_eps: must be finite and > 0, got nan", "coda.block: `qk_eps`: must be finite"),
    (_lce, "linear_cross_entropy",
     "w: must be row-major (strides[1] == 1)", "coda.linear_cross_entropy: `w`: must be row-major"),
    (_lce, "linear_cross_entropy",
     "targets: must be contiguous (dense row-major)", "coda.linear_cross_entropy: `targets`: must be contiguous"),
    (_lce, "linear_cross_entropy",
     "options->label_smoothing: must be in [0, 1], got 2", "coda.linear_cross_entropy: `label_smoothing`: must"),
    (lambda: _lce(_t(3, 8).requires_grad_()), "linear_cross_entropy_bwd",
     "x: data pointer 0x7f0000000002 is not 16-byte aligned (TMA rule)",
     "coda.linear_cross_entropy: `x`: data pointer"),
    (lambda: coda.ops.cross_entropy(_t(3, 8), _LCE["targets"]), "cross_entropy",
     "logits: data pointer is not aligned to its 2-byte bf16 elements", "coda.cross_entropy: `logits`: data pointer"),
]


def test_every_public_op_has_error_cases():
    """The call lists of this file are written by hand: each public op needs an argument-check case and a
    library-error case (its library_names mapping)."""
    import inspect
    source = inspect.getsource(inspect.getmodule(test_every_public_op_has_error_cases))
    missing = [op for op in coda.ops.__all__ if f"coda.ops.{op}(" not in source]
    assert not missing, f"public ops without error cases here: {missing}"


@pytest.mark.parametrize("call,function,message,match", _LIBRARY_CASES)
def test_library_errors_name_the_callers_argument(monkeypatch, call, function, message, match):
    """A rule only libcoda checks (alignment, strides, aliasing, device) fails inside a public op: the error names
    the public op and the argument its caller passed (w_down, not the C function's `w`), keeps the library's rule
    and its exception type, and says which C function refused. Mechanism test on the CPU path."""
    _raise_library_error(monkeypatch, function, message)
    with pytest.raises(ValueError, match=f"^{match}") as info:
        call()
    assert str(info.value).endswith(f"(checked by coda_{function})"), info.value  # which library function refused


def test_library_error_object():
    """coda._C.error: the exception _C.call raises for a failed C call, with the function and message apart (the
    library's coda_last_error() already starts with the function's name: it is not repeated)."""
    e = coda._C.error(2, "linear_rowscale", "coda_linear_rowscale: w: dtype fp16 must match h (bf16)")
    assert isinstance(e, TypeError)
    assert str(e) == "coda_linear_rowscale: w: dtype fp16 must match h (bf16)"
    assert (e.coda_function, e.coda_message) == ("coda_linear_rowscale", "w: dtype fp16 must match h (bf16)")


def test_library_error_type_is_kept(monkeypatch):
    _raise_library_error(monkeypatch, "linear_residual_rmsnorm", "w: dtype fp16 must match a (bf16)", status=2)
    with pytest.raises(TypeError, match="^coda.swiglu_mlp: `w_down`: dtype fp16"):
        _swiglu()


def test_library_errors_through_the_nn_modules(monkeypatch):
    _raise_library_error(monkeypatch, "linear_residual_rmsnorm", "w: must be row-major (strides[1] == 1)")
    mlp = coda.nn.SwiGLUMLP(8, 6)
    with pytest.raises(ValueError, match="^coda.swiglu_mlp: `w_down`: must be row-major"):
        mlp(_t(3, 8))


# ---- issue 24, item 7: zero-size features; any layout of targets and positions ----------------------------------

@pytest.mark.parametrize("call,match", [
    (lambda: coda.ops.rmsnorm_prepare(_t(3, 0), _t(0)), "^coda.rmsnorm_prepare: `x` must have at least one feature"),
    (lambda: coda.ops.linear_residual_rmsnorm(_t(3, 0), _t(8, 0), _t(3, 8), _t(8)),
     "^coda.linear_residual_rmsnorm: `a` must have at least one feature"),
    (lambda: coda.ops.linear_residual_rmsnorm(_t(3, 8), _t(0, 8), _t(3, 0), _t(0)),
     "^coda.linear_residual_rmsnorm: `w` must have at least one row"),
    (lambda: coda.ops.rmsnorm_linear(_t(3, 0), _t(0), _t(4, 0)), "^coda.rmsnorm_linear: `x` must have at least one"),
    (lambda: coda.ops.rmsnorm_linear(_t(3, 8), _t(8), _t(0, 8)), "^coda.rmsnorm_linear: `w` must have at least one"),
    (lambda: coda.ops.rmsnorm_qkv_rope(*_qkv_args(x=_t(3, 0), gamma=_t(0), w_qkv=_t(256, 0))),
     "^coda.rmsnorm_qkv_rope: `x` must have at least one feature"),
    (lambda: coda.ops.swiglu_mlp(_t(3, 0), _t(0), _t(4, 0), _t(0, 2)), "^coda.swiglu_mlp: `x` must have at least one"),
    (lambda: coda.ops.swiglu_mlp(_t(3, 8), _t(8), _t(0, 8), _t(8, 0)), "^coda.swiglu_mlp: `w_gu` must have at least"),
    (lambda: coda.ops.block(**_block_args(d=0)), "^coda.block: `x0` must have at least one feature"),
    (lambda: coda.ops.block(**_block_args(F=0)), "^coda.block: `w_gu` must have at least one row"),
    (lambda: coda.ops.linear_cross_entropy(_t(3, 0), _t(0), _t(16, 0), **_LCE),
     "^coda.linear_cross_entropy: `x` must have at least one feature"),
    (lambda: coda.ops.linear_cross_entropy(_t(3, 8), _t(8), _t(0, 8), **_LCE),
     "^coda.linear_cross_entropy: `w` must have at least one row"),
    (lambda: coda.ops.cross_entropy(_t(3, 0), _LCE["targets"]), "^coda.cross_entropy: `logits` must have at least one"),
    (lambda: coda.ops.cross_entropy(torch.tensor(1.0), torch.tensor(0)), "^coda.cross_entropy: `logits` must have a"),
    (lambda: coda.ops.linear_residual_rmsnorm(torch.tensor(1.0), _t(8, 8), _t(8), _t(8)),
     "^coda.linear_residual_rmsnorm: `a` must have a feature dimension"),
])
def test_zero_features_are_refused(call, match):
    """No features (d = 0, V = 0, F = 0, w without rows): a ValueError naming the argument, on every device (the
    kernels need K, N > 0; an RMSNorm over no features is 0/0), instead of torch's reshape error."""
    with pytest.raises(ValueError, match=match):
        call()


def test_zero_tokens_work():
    """M = 0 (no tokens) is valid and gives empty outputs of the right shapes."""
    x = _t(2, 0, 8)
    assert coda.ops.rmsnorm_linear(x, _t(8), _t(4, 8)).shape == (2, 0, 4)
    assert coda.ops.swiglu_mlp(x, _t(8), _t(12, 8), _t(8, 6))[0].shape == (2, 0, 8)
    assert coda.ops.rmsnorm_qkv_rope(*_qkv_args(x=x)[:3], torch.zeros(2, 0, dtype=torch.long), _t(32), 2, 1,
                                      64).shape == (2, 0, 256)
    assert coda.ops.block(**_block_args(M=0))[1].shape == (0, 192)
    assert coda.ops.linear_cross_entropy(x, _t(8), _t(16, 8), torch.zeros(2, 0, dtype=torch.long)).item() == 0.0


def _c_parameters():
    from pathlib import Path
    headers = Path(__file__).resolve().parents[2] / "include" / "coda"
    text = "".join((headers / h).read_text(encoding="utf-8") for h in ("coda.h", "block.h"))
    return {name: params for name, (_, params) in coda._C.declarations(text).items()}


class _Recorder:
    """Stands in for libcoda in _kernels' calls: records every tensor descriptor it is given, and checks that each
    call passes as many arguments as its C function takes (coda.h, block.h)."""

    def __init__(self, monkeypatch):
        self.calls = []
        params = _c_parameters()

        def call(name, *args):
            assert len(args) == len(params[f"coda_{name}"]), (name, len(args))
            self.calls.append((name, args))

        monkeypatch.setattr(coda._C, "call", call)
        monkeypatch.setattr(coda._C, "workspace_size", lambda name, *args: 0)
        monkeypatch.setattr(coda._C, "stream", lambda device: None)
        lib = type("Lib", (), {"coda_block_forward_workspace_size": staticmethod(lambda *a: 0),
                               "coda_block_backward_workspace_size": staticmethod(lambda *a: 0)})
        monkeypatch.setattr(coda._C, "library", lambda: lib)

    def vectors(self):
        """(call, sizes, strides) of every 1-D tensor descriptor passed."""
        out = []
        for name, args in self.calls:
            for a in args:
                t = getattr(a, "_obj", None)
                if isinstance(t, coda._C.Tensor) and t.rank == 1:
                    out.append((name, t.sizes[0], t.strides[0]))
        return out


def test_cuda_path_passes_dense_targets_and_positions(monkeypatch):
    """The C ABI takes targets, positions and inv_freq as dense vectors; _kernels copies strided ones (they are
    [tokens] and [head_dim/2]), so any layout works on CUDA as on the CPU. Checked on the descriptors _kernels
    hands the library (recorded here without a GPU)."""
    rec = _Recorder(monkeypatch)
    bf, M, d, V, hd = torch.bfloat16, 4, 64, 16, 64
    K = coda._kernels
    h, w, rstd, x, g = _t(M, d, dtype=bf), _t(V, d, dtype=bf), _t(M), _t(M, d, dtype=bf), _t(d, dtype=bf)
    targets = torch.zeros(M, 3, dtype=torch.long)[:, 1]
    positions = torch.zeros(M, 2, dtype=torch.int32)[:, 0]
    inv_freq = _t(hd, 2)[:, 0][: hd // 2]
    K.cross_entropy(_t(M, V, dtype=bf), targets, None, -100, "mean", 0.0, 0.0, 0.0, 1, False)
    K.linear_cross_entropy(h, w, rstd, targets, -100, "mean", 0.0, 0.0, 0.0, 0)
    K.linear_cross_entropy_bwd(h, w, rstd, x, g, targets, None, -100, "mean", 0.0, 0.0, 0.0, 0, want_loss=True)
    w_qkv = _t(3 * hd, d, dtype=bf)
    K.linear_rowscale_rope(h, w_qkv, rstd, positions, inv_freq, 1, 1, hd)
    qkv = _t(M, 3 * hd, dtype=bf)
    K.rope_bwd_zdz(qkv, qkv.clone(), positions, inv_freq, 1, 1, hd, d)
    w_o, w_gu, w_down = _t(d, hd, dtype=bf), _t(2 * d, d, dtype=bf), _t(d, d, dtype=bf)
    y0 = _t(M, hd, dtype=bf)
    saved = K.block_forward(y0, x, w_o, g, w_gu, w_down, g, w_qkv, positions, inv_freq, 1, 1, hd, 1e-6)
    x1, rstd1, z1, x2, rstd2, qkv, _ = saved
    K.block_backward(y0, positions, inv_freq, w_o, g, w_gu, w_down, g, w_qkv, x1, rstd1, z1, x2, rstd2, qkv,
                     qkv.clone(), None, 1, 1, hd, 1e-6)
    called = {name for name, _ in rec.calls}
    assert called == {"cross_entropy", "linear_cross_entropy", "linear_cross_entropy_bwd", "linear_rowscale_rope",
                      "rope_bwd_zdz", "block_forward", "block_backward"}
    vectors = rec.vectors()
    assert {name for name, n, _ in vectors if n > 1} == called, vectors  # the targets/positions of every call seen
    strided = [(name, n, s) for name, n, s in vectors if n > 1 and s != 1]
    assert not strided, f"strided vectors handed to libcoda: {strided}"


def test_strided_targets_and_positions_cpu():
    """Any layout of targets and positions gives the result of their contiguous copies (CPU)."""
    x, g, w = _t(2, 3, 8), _t(8), _t(16, 8)
    targets = torch.randint(0, 16, (3, 2)).t()  # [2, 3], strides (1, 2)
    assert torch.equal(coda.ops.linear_cross_entropy(x, g, w, targets),
                       coda.ops.linear_cross_entropy(x, g, w, targets.contiguous()))
    logits = _t(2, 3, 16)
    assert torch.equal(coda.ops.cross_entropy(logits, targets), coda.ops.cross_entropy(logits, targets.contiguous()))
    positions = torch.arange(6).reshape(3, 2).t()
    args = _qkv_args(x=x)
    assert torch.equal(coda.ops.rmsnorm_qkv_rope(*args[:3], positions, *args[4:]),
                       coda.ops.rmsnorm_qkv_rope(*args[:3], positions.contiguous(), *args[4:]))


# ---- the same rules against the real library (GPU) -------------------------------------------------------------

def _bf(*shape):
    return torch.randn(*shape, dtype=torch.bfloat16, device="cuda")


def _strided(rows, cols, pad=4):
    """[rows, cols] bf16 with a row stride of cols + pad elements (not a 16-byte multiple for pad = 4)."""
    return _bf(rows, cols + pad)[:, :cols]


_D, _F, _HD, _M = 64, 64, 64, 4


def _pos():
    return torch.arange(_M, device="cuda")


def _inv():
    return torch.rand(_HD // 2, device="cuda")


def _blk(**over):
    args = dict(y0=_bf(_M, _HD), x0=_bf(_M, _D), w_o=_bf(_D, _HD), gamma1=_bf(_D), w_gu=_bf(2 * _F, _D),
                w_down=_bf(_D, _F), gamma2=_bf(_D), w_qkv=_bf(3 * _HD, _D), positions=_pos(), inv_freq=_inv(),
                n_q_heads=1, n_kv_heads=1, head_dim=_HD)
    args.update(over)
    return coda.ops.block(**args)


def _tg():
    return torch.zeros(_M, dtype=torch.long, device="cuda")


# (call, public op, the argument its error must name): layouts only libcoda refuses
_GPU_LIBRARY_CASES = {
    "swiglu_mlp-w_down-stride": (lambda: coda.ops.swiglu_mlp(_bf(_M, _D), _bf(_D), _bf(2 * _F, _D),
                                                             _strided(_D, _F)), "swiglu_mlp", "w_down"),
    "swiglu_mlp-w_down-colmajor": (lambda: coda.ops.swiglu_mlp(_bf(_M, _D), _bf(_D), _bf(2 * _F, _D),
                                                               _bf(_F, _D).t()), "swiglu_mlp", "w_down"),
    "swiglu_mlp-w_gu": (lambda: coda.ops.swiglu_mlp(_bf(_M, _D), _bf(_D), _strided(2 * _F, _D), _bf(_D, _F)),
                        "swiglu_mlp", "w_gu"),
    "swiglu_mlp-next_gamma": (lambda: coda.ops.swiglu_mlp(_bf(_M, _D), _bf(_D), _bf(2 * _F, _D), _bf(_D, _F),
                                                          next_gamma=_bf(_D, 2)[:, 0]), "swiglu_mlp", "next_gamma"),
    "swiglu_mlp-x": (lambda: coda.ops.swiglu_mlp(_strided(_M, _D), _bf(_D), _bf(2 * _F, _D), _bf(_D, _F)),
                     "swiglu_mlp", "x"),
    "rmsnorm_qkv_rope-w_qkv": (lambda: coda.ops.rmsnorm_qkv_rope(_bf(_M, _D), _bf(_D), _strided(3 * _HD, _D),
                                                                   _pos(), _inv(), 1, 1, _HD),
                                "rmsnorm_qkv_rope", "w_qkv"),
    "rmsnorm_qkv_rope-gamma": (lambda: coda.ops.rmsnorm_qkv_rope(_bf(_M, _D), _bf(_D, 2)[:, 0], _bf(3 * _HD, _D),
                                                                   _pos(), _inv(), 1, 1, _HD),
                                "rmsnorm_qkv_rope", "gamma"),
    "rmsnorm_linear-w": (lambda: coda.ops.rmsnorm_linear(_bf(_M, _D), _bf(_D), _strided(32, _D)),
                          "rmsnorm_linear", "w"),
    "rmsnorm_linear-cache": (lambda: coda.ops.rmsnorm_linear(_bf(_M, _D), _bf(_D), _bf(32, _D), cache=(
        _strided(_M, _D), torch.ones(_M, device="cuda"))), "rmsnorm_linear", "cache[0] (h)"),
    "linear_residual_rmsnorm-residual": (lambda: coda.ops.linear_residual_rmsnorm(
        _bf(_M, _F), _bf(_D, _F), _strided(_M, _D), _bf(_D)), "linear_residual_rmsnorm", "residual"),
    "linear_residual_rmsnorm-w": (lambda: coda.ops.linear_residual_rmsnorm(
        _bf(_M, _F), _strided(_D, _F), _bf(_M, _D), _bf(_D)), "linear_residual_rmsnorm", "w"),
    "rmsnorm_prepare-x": (lambda: coda.ops.rmsnorm_prepare(_strided(_M, _D), _bf(_D)), "rmsnorm_prepare", "x"),
    "block-w_down": (lambda: _blk(w_down=_strided(_D, _F)), "block", "w_down"),
    "block-w_gu": (lambda: _blk(w_gu=_strided(2 * _F, _D)), "block", "w_gu"),
    "block-w_o": (lambda: _blk(w_o=_strided(_D, _HD)), "block", "w_o"),
    "block-w_qkv": (lambda: _blk(w_qkv=_strided(3 * _HD, _D)), "block", "w_qkv"),
    "block-gamma1": (lambda: _blk(gamma1=_bf(_D, 2)[:, 0]), "block", "gamma1"),
    "block-gamma2": (lambda: _blk(gamma2=_bf(_D, 2)[:, 0]), "block", "gamma2"),
    "block-x0": (lambda: _blk(x0=_strided(_M, _D)), "block", "x0"),
    "block-y0": (lambda: _blk(y0=_strided(_M, _HD)), "block", "y0"),
    "linear_cross_entropy-w": (lambda: coda.ops.linear_cross_entropy(_bf(_M, _D), _bf(_D), _strided(64, _D), _tg()),
                               "linear_cross_entropy", "w"),
    "linear_cross_entropy-x-train": (lambda: coda.ops.linear_cross_entropy(
        _strided(_M, _D).requires_grad_(), _bf(_D), _bf(64, _D), _tg()), "linear_cross_entropy", "x"),
}


@requires_gpu
@pytest.mark.parametrize("case", list(_GPU_LIBRARY_CASES))
def test_gpu_library_errors_name_the_callers_argument(case):
    """Strided / misaligned arguments that only libcoda refuses (TMA alignment, row-major, dense vectors): the error
    names the public op and the caller's argument (coda.swiglu_mlp: `w_down`: ..., not coda_linear_residual_rmsnorm:
    w: ...)."""
    call, op, name = _GPU_LIBRARY_CASES[case]
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert message.startswith(f"coda.{op}: `{name}`: "), message


@requires_gpu
def test_gpu_zero_features_are_refused():
    with pytest.raises(ValueError, match="^coda.rmsnorm_linear: `x` must have at least one feature"):
        coda.ops.rmsnorm_linear(_bf(3, 0), _bf(0), _bf(8, 0))
    with pytest.raises(ValueError, match="^coda.cross_entropy: `logits` must have at least one"):
        coda.ops.cross_entropy(_bf(3, 0), torch.zeros(3, dtype=torch.long, device="cuda"))


@requires_gpu
def test_gpu_strided_targets_and_positions():
    """Non-contiguous targets and positions work on CUDA and give the contiguous copies' results."""
    M, d, V, hd = 6, 64, 64, 64
    x, g, w = _bf(2, M // 2, d), _bf(d), _bf(V, d)
    targets = torch.randint(0, V, (M // 2, 2), device="cuda").t()
    assert torch.equal(coda.ops.linear_cross_entropy(x, g, w, targets),
                       coda.ops.linear_cross_entropy(x, g, w, targets.contiguous()))
    logits = _bf(2, M // 2, V)
    assert torch.equal(coda.ops.cross_entropy(logits, targets), coda.ops.cross_entropy(logits, targets.contiguous()))
    positions = torch.arange(M, device="cuda", dtype=torch.int32).reshape(M // 2, 2).t()
    inv = torch.rand(hd, device="cuda")[::2]
    w_qkv = _bf(3 * hd, d)
    assert torch.equal(coda.ops.rmsnorm_qkv_rope(x, g, w_qkv, positions, inv, 1, 1, hd),
                       coda.ops.rmsnorm_qkv_rope(x, g, w_qkv, positions.contiguous(), inv.contiguous(), 1, 1, hd))
    args = dict(y0=_bf(2, M // 2, hd), x0=x, w_o=_bf(d, hd), gamma1=g, w_gu=_bf(2 * d, d), w_down=_bf(d, d),
                gamma2=_bf(d), w_qkv=w_qkv, inv_freq=inv.contiguous(), n_q_heads=1, n_kv_heads=1, head_dim=hd)
    a, b = coda.ops.block(positions=positions, **args), coda.ops.block(positions=positions.contiguous(), **args)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("qk_norm", [False, True])
def test_cuda_block_packs_the_qk_norm_fields(qk_norm, monkeypatch):
    """What _kernels.block_forward / block_backward hand the library (recorded here without a GPU): block.h version
    2 with the QK-norm's fields set (config.qk_eps, the gammas as fp32 [head_dim], saved.z, the gamma gradients) or
    unset (all zero) without it; the fp32 copies of bf16 gammas are alive when the C call runs (the structs hold
    their pointers only)."""
    import weakref
    rec = _Recorder(monkeypatch)
    K, C = coda._kernels, coda._C
    copies, alive = [], []
    real = K.float_pairs

    def float_pairs(t):
        out = real(t)
        copies.append(weakref.ref(out))
        return out

    monkeypatch.setattr(K, "float_pairs", float_pairs)
    recorded = C.call

    def call(name, *args):
        recorded(name, *args)
        alive.append(all(r() is not None for r in copies[-2:]))

    monkeypatch.setattr(C, "call", call)
    bf, M, d, hd = torch.bfloat16, 4, 64, 64
    w_o, g, w_gu, w_down = _t(d, hd, dtype=bf), _t(d, dtype=bf), _t(2 * d, d, dtype=bf), _t(d, d, dtype=bf)
    w_qkv, y0, x = _t(3 * hd, d, dtype=bf), _t(M, hd, dtype=bf), _t(M, d, dtype=bf)
    pos, inv = torch.zeros(M, dtype=torch.int32), _t(hd // 2)
    qk = dict(q_gamma=_t(hd, dtype=bf), k_gamma=_t(hd, dtype=bf), qk_eps=1e-6) if qk_norm else {}
    x1, rstd1, z1, x2, rstd2, qkv, z = K.block_forward(y0, x, w_o, g, w_gu, w_down, g, w_qkv, pos, inv, 1, 1, hd,
                                                        1e-5, **qk)
    assert (z is not None) == qk_norm
    grads = K.block_backward(y0, pos, inv, w_o, g, w_gu, w_down, g, w_qkv, x1, rstd1, z1, x2, rstd2, qkv,
                             qkv.clone(), None, 1, 1, hd, 1e-5, z=z, **qk)
    assert (grads[8] is not None and grads[8].shape == (hd,) and grads[8].dtype == torch.float32) == qk_norm
    assert [name for name, _ in rec.calls] == ["block_forward", "block_backward"] and all(alive)
    unset = bytes(ctypes.sizeof(C.Tensor))
    for name, args in rec.calls:
        cfg, weights = args[0], args[1]
        saved = args[6] if name == "block_forward" else args[5]
        assert cfg.struct_size == ctypes.sizeof(C.BlockConfig) and cfg.reserved == 0
        assert cfg.qk_eps == (pytest.approx(1e-6) if qk_norm else 0.0)
        for t in (weights.q_gamma, weights.k_gamma) + ((args[10].q_gamma, args[10].k_gamma) if name ==
                                                       "block_backward" else ()):
            if qk_norm:
                assert (t.dtype, t.rank, t.sizes[0]) == (C.DTYPE[torch.float32], 1, hd) and t.data, name
            else:
                assert bytes(t) == unset, name
        if qk_norm:
            assert saved.z.data == z.data_ptr(), name
        else:
            assert bytes(saved.z) == unset, name
    assert len(copies) == (4 if qk_norm else 0)  # q and k, forward and backward
