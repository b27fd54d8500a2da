"""The loss family: cross-entropy over stored logits (cross_entropy) and the LM head + cross-entropy without the
logits in memory (linear_cross_entropy: linear_rowscale_lse's statistics, the chunked backward, the one-pass
training step), with the scale-and-cast of the LM head's weight gradient (scale_cast).

Each op here: its public function (coda.ops), its custom op with fake kernel and autograd (_library), its CUDA call
(`<op>_cuda`, read as _kernels.<op>) and its float64 twin (`<op>_f64`, read as _reference.<op>); MATH.md has the
equations.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .. import _C
from .. import _check as check
from .. import _kernels as K
from .. import _reference as R
from .._kernels import kernel
from .._library import custom_op, eager_plain, impl, no_grad_outputs, register_autograd, stat, stat_dtype
from .._reference import reference
from ._common import CACHE, CE_OPTIONS, PREPARE, library_names, norm_args, norm_cache, rows, same

_d = _C.desc

__all__ = ["linear_cross_entropy", "cross_entropy"]


# ---- public ops ------------------------------------------------------------------------------------------------------

def _ce_args(op, ignore_index, reduction, label_smoothing, z_loss, softcap):
    check.reduction(op, reduction)
    check.number(op, "label_smoothing", label_smoothing)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"coda.{op}: `label_smoothing` must be in [0, 1], got {label_smoothing}")
    check.nonnegative(op, "z_loss", z_loss)
    if softcap is not None:
        check.nonnegative(op, "softcap", softcap, " (0 or None: off)")
    return int(ignore_index), reduction, float(label_smoothing), float(z_loss), float(softcap or 0.0)


@library_names(
    rmsnorm_prepare=PREPARE,
    linear_cross_entropy={**CACHE, **same("w", "targets", "chunk_rows"), **CE_OPTIONS},
    linear_cross_entropy_bwd={**CACHE, **same("w", "x", "gamma", "targets", "chunk_rows"), **CE_OPTIONS})
def linear_cross_entropy(x, gamma, w, targets, eps=1e-6, *, cache=None, ignore_index=-100, reduction="mean",
                         label_smoothing=0.0, z_loss=0.0, softcap=None, chunk_rows=0):
    """Final RMSNorm + LM head + cross-entropy without the logits in memory (linear_rowscale_lse / cross_entropy
    and the chunked LM-head backward): l = rmsnorm(x; gamma) w^T, optionally softcapped, loss as
    torch.nn.functional.cross_entropy(l, targets, ignore_index, reduction, label_smoothing) plus z_loss * lse^2 per
    row.

    x [..., d]; gamma [d]; w [V, d] (any V); targets [...] int64/int32 (ignore_index rows give 0 loss
    and 0 gradient; mean averages over the other rows, and is 0 when every row is ignored, where torch gives NaN; a
    target outside [0, V) that is not ignore_index makes the loss NaN instead of raising, since raising would need a
    host synchronisation). Returns the loss: fp32 [] for mean/sum, [...] for none.
    chunk_rows: tokens per fused GEMM (0: the library's default). With gradients required and a mean/sum
    reduction, the forward computes the loss and the gradients in one chunked pass (logits, their gradient, dgrad
    and wgrad per chunk: 3 GEMMs of tokens x V x d) and the backward only scales them by the upstream gradient;
    otherwise the forward keeps row statistics only and the backward recomputes the logits chunk by chunk.
    """
    op = "linear_cross_entropy"
    norm_args(op, x, gamma, w, eps)
    check.tensor(op, "targets", targets, dtype=(torch.int32, torch.int64))
    check.same_device(op, x=x, targets=targets)
    if targets.shape != x.shape[:-1]:
        raise ValueError(f"coda.{op}: `targets` must have shape {tuple(x.shape[:-1])} (one per token), got "
                         f"{tuple(targets.shape)}")
    if chunk_rows < 0:
        raise ValueError(f"coda.{op}: `chunk_rows` must be >= 0 (0: default), got {chunk_rows}")
    opts = _ce_args(op, ignore_index, reduction, label_smoothing, z_loss, softcap)
    x2 = rows(x)
    h, rstd = norm_cache(op, x, x2, gamma, float(eps), cache)
    if reduction != "none" and torch.is_grad_enabled() and any(t.requires_grad for t in (x, gamma, w)):
        # Training: loss and gradients in one pass (the gradients are scaled by the upstream gradient later).
        t = targets.reshape(-1)
        if reduction == "mean" and x.dtype == torch.float16:
            # fp16: the gradients of the sum (p - onehot per row, inside fp16's normal range), and the mean's 1/N
            # applied with the upstream gradient. Taken with 1/N in the one pass, the logits' gradients (~1/(N V))
            # fall below fp16's smallest normal before a loss scaler's factor could lift them: measured up to 6x
            # (loss scale 1) and 37x (4096) the unpatched model's gradient error (bench/results/fp16_gradients).
            loss = linear_cross_entropy_train_op(x2, gamma, w, h, rstd, t, opts[0], "sum", *opts[2:],
                                                 int(chunk_rows))[0]
            return loss / (t != opts[0]).sum().clamp(min=1)
        return linear_cross_entropy_train_op(x2, gamma, w, h, rstd, t, *opts, int(chunk_rows))[0]
    loss, _ = linear_cross_entropy_op(x2, gamma, w, h, rstd, targets.reshape(-1), *opts, int(chunk_rows))
    return loss.reshape(x.shape[:-1]) if reduction == "none" else loss


@library_names(cross_entropy={**same("logits", "targets"), **CE_OPTIONS})
def cross_entropy(logits, targets, *, ignore_index=-100, reduction="mean", label_smoothing=0.0, z_loss=0.0,
                  softcap=None):
    """Cross-entropy over stored logits (as torch.nn.functional.cross_entropy, plus z_loss and softcap).

    logits [..., V] bf16/fp16 (CUDA) or any float (CPU), any V and row stride (rows that are not 16-byte vectors
    take a slower scalar path); targets [...] int64/int32. Returns the fp32 loss ([] for mean/sum, [...] for none);
    finite for any finite logits (the row max is subtracted before any scaling). The backward recomputes the
    softmax from the logits (nothing [.., V] is saved besides the logits themselves).
    """
    op = "cross_entropy"
    check.tensor(op, "logits", logits, floating=True)
    check.features(op, "logits", logits)
    check.tensor(op, "targets", targets, dtype=(torch.int32, torch.int64))
    check.same_device(op, logits=logits, targets=targets)
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"coda.{op}: `targets` must have shape {tuple(logits.shape[:-1])}, got "
                         f"{tuple(targets.shape)}")
    opts = _ce_args(op, ignore_index, reduction, label_smoothing, z_loss, softcap)
    loss = cross_entropy_op(rows(logits), targets.reshape(-1), *opts)
    return loss.reshape(logits.shape[:-1]) if reduction == "none" else loss


# ---- custom ops and autograd -----------------------------------------------------------------------------------------

@custom_op("coda::linear_cross_entropy", mutates_args=())
def linear_cross_entropy_op(x: Tensor, gamma: Tensor, w: Tensor, h: Tensor, rstd: Tensor, targets: Tensor,
                            ignore_index: int, reduction: str, label_smoothing: float, z_loss: float, softcap: float,
                            chunk_rows: int) -> tuple[Tensor, Tensor]:
    return impl(h).linear_cross_entropy(h, w, rstd, targets, ignore_index, reduction, label_smoothing, z_loss,
                                        softcap, chunk_rows)


@linear_cross_entropy_op.register_fake
def _(x, gamma, w, h, rstd, targets, ignore_index, reduction, label_smoothing, z_loss, softcap, chunk_rows):
    M = h.shape[0]
    return stat(K.loss_shape(M, reduction), h), stat((M,), h)


@custom_op("coda::linear_cross_entropy_bwd", mutates_args=())
def linear_cross_entropy_bwd_op(h: Tensor, w: Tensor, rstd: Tensor, x: Tensor, gamma: Tensor, targets: Tensor,
                                grad_loss: Tensor, ignore_index: int, reduction: str, label_smoothing: float,
                                z_loss: float, softcap: float, chunk_rows: int) -> tuple[Tensor, Tensor, Tensor]:
    return impl(h).linear_cross_entropy_bwd(h, w, rstd, x, gamma, targets, grad_loss, ignore_index, reduction,
                                            label_smoothing, z_loss, softcap, chunk_rows)


@linear_cross_entropy_bwd_op.register_fake
def _(h, w, rstd, x, gamma, targets, grad_loss, ignore_index, reduction, label_smoothing, z_loss, softcap,
      chunk_rows):
    return x.new_empty(x.shape), stat(w.shape, h), stat((h.shape[1],), h)


def _lce_ctx(ctx, inputs, output):
    x, gamma, w, h, rstd, targets, *options = inputs
    ctx.save_for_backward(h, w, rstd, x, gamma, targets)
    ctx.options = options
    no_grad_outputs(ctx, output[1])


def _lce_bwd(ctx, dloss, dlse):
    h, w, rstd, x, gamma, targets = ctx.saved_tensors
    if dloss is None:
        return (None,) * 12
    grad_loss = dloss.to(stat_dtype(h)).contiguous()
    dx, dw, dgamma = linear_cross_entropy_bwd_op(h, w, rstd, x, gamma, targets, grad_loss, *ctx.options)
    return dx, dgamma.to(gamma.dtype), dw.to(w.dtype), None, None, None, None, None, None, None, None, None


register_autograd(linear_cross_entropy_op, _lce_bwd, _lce_ctx)


@custom_op("coda::linear_cross_entropy_train", mutates_args=())
def linear_cross_entropy_train_op(x: Tensor, gamma: Tensor, w: Tensor, h: Tensor, rstd: Tensor, targets: Tensor,
                                  ignore_index: int, reduction: str, label_smoothing: float, z_loss: float,
                                  softcap: float, chunk_rows: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The training step of the LM head in one pass: loss and its gradients for an upstream gradient of 1
    (coda_linear_cross_entropy_bwd with loss_out: 3 GEMMs of M x V x d instead of 4 for forward + backward).
    Mean and sum reductions only: their gradients scale with the scalar upstream gradient."""
    dx, dw, dgamma, loss = impl(h).linear_cross_entropy_bwd(h, w, rstd, x, gamma, targets, None, ignore_index,
                                                            reduction, label_smoothing, z_loss, softcap, chunk_rows,
                                                            want_loss=True)
    return loss, dx, dw, dgamma


@linear_cross_entropy_train_op.register_fake
def _(x, gamma, w, h, rstd, targets, ignore_index, reduction, label_smoothing, z_loss, softcap, chunk_rows):
    return stat((), h), x.new_empty(x.shape), stat(w.shape, h), stat((h.shape[1],), h)


def _lce_train_ctx(ctx, inputs, output):
    x, gamma, w = inputs[:3]
    loss, dx, dw, dgamma = output
    ctx.save_for_backward(dx, dw, dgamma)
    ctx.dtypes = (gamma.dtype, w.dtype)
    no_grad_outputs(ctx, dx, dw, dgamma)


def _scaled_cast(t: Tensor, g: Tensor, dtype: torch.dtype) -> Tensor:
    """(t * g).to(dtype) for an fp32 t and a scalar tensor g, one rounding, in one pass with no fp32 temporary:
    torch.mul computes in fp32 and rounds as it stores into the `dtype` output (the same bits as the product, then
    the cast). The saved fp32 weight gradient of the LM head is [V, d] (1 GiB at llama3-1B): the plain expression
    doubled it at peak, and a block-by-block product + copy took two kernels per block. Eager on CUDA it is one
    vectorised coda_scale_cast (same bits); traced or compiled, torch.mul. A backward with create_graph (g requires
    grad) takes the plain expression: out= has no autograd formula."""
    if torch.is_grad_enabled() and (g.requires_grad or t.requires_grad):
        return (t * g).to(dtype)
    if (eager_plain((t, g)) and t.is_cuda and g.device == t.device and t.device.index == torch.cuda.current_device()
            and t.dtype == g.dtype == torch.float32 and g.numel() == 1 and t.is_contiguous()
            and dtype in (torch.bfloat16, torch.float16)):
        # the same bits through coda_scale_cast: PyTorch's mixed-dtype loop moved 1 GiB at ~1.2 TB/s on the H200
        return K.scale_cast(t, g, dtype)
    return torch.mul(t, g, out=torch.empty(t.shape, dtype=dtype, device=t.device))


def _lce_train_bwd(ctx, dloss, *unused):
    dx, dw, dgamma = ctx.saved_tensors
    if dloss is None:
        return (None,) * 12
    g = dloss.to(dw.dtype)
    return ((dx * g).to(dx.dtype), (dgamma * g).to(ctx.dtypes[0]), _scaled_cast(dw, g, ctx.dtypes[1]), None, None,
            None, None, None, None, None, None, None)


register_autograd(linear_cross_entropy_train_op, _lce_train_bwd, _lce_train_ctx)


@custom_op("coda::cross_entropy", mutates_args=())
def cross_entropy_op(logits: Tensor, targets: Tensor, ignore_index: int, reduction: str, label_smoothing: float,
                     z_loss: float, softcap: float) -> Tensor:
    return impl(logits).cross_entropy(logits, targets, None, ignore_index, reduction, label_smoothing, z_loss,
                                      softcap, 1, False)[0]


@cross_entropy_op.register_fake
def _(logits, targets, ignore_index, reduction, label_smoothing, z_loss, softcap):
    return stat(K.loss_shape(logits.shape[0], reduction), logits)


@custom_op("coda::cross_entropy_bwd", mutates_args=())
def cross_entropy_bwd_op(logits: Tensor, targets: Tensor, grad_loss: Tensor, ignore_index: int, reduction: str,
                         label_smoothing: float, z_loss: float, softcap: float) -> Tensor:
    return impl(logits).cross_entropy(logits, targets, grad_loss, ignore_index, reduction, label_smoothing, z_loss,
                                      softcap, 1, True)[1]


@cross_entropy_bwd_op.register_fake
def _(logits, targets, grad_loss, ignore_index, reduction, label_smoothing, z_loss, softcap):
    return logits.new_empty(logits.shape)


def _ce_ctx(ctx, inputs, output):
    logits, targets, *options = inputs
    ctx.save_for_backward(logits, targets)
    ctx.options = options


def _ce_bwd(ctx, dloss):
    logits, targets = ctx.saved_tensors
    grad_loss = dloss.to(stat_dtype(logits)).contiguous()
    return cross_entropy_bwd_op(logits, targets, grad_loss, *ctx.options), None, None, None, None, None, None


register_autograd(cross_entropy_op, _ce_bwd, _ce_ctx)


# ---- CUDA calls and float64 twins ------------------------------------------------------------------------------------

def _ce(l64, targets, grad_loss, ignore_index, reduction, label_smoothing, z_loss, softcap, want_grad):
    """Cross-entropy on float64 logits. -> (loss, dl float64 or None, lse)."""
    M, V = l64.shape
    lc = softcap * torch.tanh(l64 / softcap) if softcap > 0 else l64
    # lse = mx + lse_rel, and the loss uses lse_rel + (mx - l): with a logit of 1e20, mx + log 2 would round to mx.
    mx = lc.amax(-1) if V > 0 else l64.new_zeros(M)
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    lse_rel = torch.logsumexp(lc - mx[:, None], dim=-1) if V > 0 else l64.new_zeros(M)
    lse = mx + lse_rel
    t = targets.to(torch.int64)
    ignored = t == ignore_index
    bad = ~ignored & ((t < 0) | (t >= V))
    safe_t = torch.where(ignored | bad, torch.zeros_like(t), t)
    lt = lc.gather(1, safe_t[:, None])[:, 0]
    per_row = ((1 - label_smoothing) * (lse_rel + (mx - lt)) + label_smoothing * (lse_rel + (mx - lc.mean(-1)))
               + z_loss * lse.square())
    per_row = torch.where(ignored, torch.zeros_like(per_row), per_row)
    per_row = torch.where(bad, torch.full_like(per_row, float("nan")), per_row)
    n_valid = int((~ignored).sum())
    if reduction == "none":
        loss = per_row
    elif reduction == "sum":
        loss = per_row.sum()
    else:
        loss = per_row.sum() / n_valid if n_valid > 0 else l64.new_zeros(())
    if not want_grad:
        return loss, None, lse
    g = l64.new_ones(()) if grad_loss is None else R.f64(grad_loss)
    if reduction == "mean":
        g = g / max(n_valid, 1)
    g = g.expand(M) if g.dim() == 0 else g
    p = torch.softmax(lc, dim=-1)
    onehot = torch.nn.functional.one_hot(safe_t, V).to(torch.float64)
    dlc = g[:, None] * (p - (1 - label_smoothing) * onehot - label_smoothing / V + 2 * z_loss * lse[:, None] * p)
    dl = dlc * (1 - torch.tanh(l64 / softcap).square()) if softcap > 0 else dlc
    dl = torch.where(ignored[:, None], torch.zeros_like(dl), dl)
    dl = torch.where(bad[:, None], torch.full_like(dl, float("nan")), dl)
    return loss, dl, lse


@kernel
def cross_entropy_cuda(logits, targets, grad_loss, ignore_index, reduction, label_smoothing, z_loss, softcap,
                       hidden_size, want_grad):
    """Cross-entropy over stored logits. -> (loss, dlogits or None, zdz or None)."""
    M, V = logits.shape
    targets = K.dense(targets)
    loss = K.f32(K.loss_shape(M, reduction), logits)
    dlogits = torch.empty_like(logits) if want_grad else None
    zdz = K.f32((M,), logits) if want_grad else None
    ws = K.workspace("cross_entropy", logits.device, M, V)
    opts = _C.ce_options(ignore_index, reduction, label_smoothing, z_loss, softcap)
    _C.call("cross_entropy", _d(logits), _d(targets), opts, _d(grad_loss), hidden_size, _d(loss), _d(dlogits),
            _d(zdz), ws.data_ptr(), ws.numel(), _C.stream(logits.device))
    return loss, dlogits, zdz


@reference
def cross_entropy_f64(logits, targets, grad_loss, ignore_index, reduction, label_smoothing, z_loss, softcap,
                      hidden_size, want_grad):
    l64 = R.f64(logits)
    loss, dl, _ = _ce(l64, targets, grad_loss, ignore_index, reduction, label_smoothing, z_loss, softcap, want_grad)
    if not want_grad:
        return R.stat_like(loss, logits), None, None
    zdz = (l64 * dl).sum(-1) / hidden_size
    return R.stat_like(loss, logits), dl.to(logits.dtype), R.stat_like(zdz, logits)


@kernel
def linear_cross_entropy_cuda(h, w, rstd, targets, ignore_index, reduction, label_smoothing, z_loss, softcap,
                              chunk_rows):
    """LM head + loss without logits in memory (linear_rowscale_lse + cross_entropy statistics). -> (loss, lse [M])."""
    M, V = h.shape[0], w.shape[0]
    targets = K.dense(targets)
    loss = K.f32(K.loss_shape(M, reduction), h)
    lse = K.f32((M,), h)
    ws = K.workspace("linear_cross_entropy", h.device, M, V, chunk_rows)
    opts = _C.ce_options(ignore_index, reduction, label_smoothing, z_loss, softcap)
    _C.call("linear_cross_entropy", _d(h), _d(w), _d(rstd), _d(targets), opts, chunk_rows, _d(loss), _d(lse),
            ws.data_ptr(), ws.numel(), _C.stream(h.device))
    return loss, lse


@reference
def linear_cross_entropy_f64(h, w, rstd, targets, ignore_index, reduction, label_smoothing, z_loss, softcap,
                             chunk_rows):
    loss, _, lse = _ce(R.rowscale(h, w, rstd), targets, None, ignore_index, reduction, label_smoothing, z_loss,
                       softcap, False)
    return R.stat_like(loss, h), R.stat_like(lse, h)


@kernel
def linear_cross_entropy_bwd_cuda(h, w, rstd, x, gamma, targets, grad_loss, ignore_index, reduction, label_smoothing,
                                  z_loss, softcap, chunk_rows, want_loss=False):
    """Backward of the LM head + loss and the final norm (chunked linear_rowscale -> cross_entropy ->
    linear_residual_rmsnorm_bwd -> dW). -> (dx, dw fp32, dgamma fp32), plus the loss from the same pass when
    want_loss (a training step without a forward call)."""
    M, d = h.shape
    V = w.shape[0]
    targets = K.dense(targets)
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    dw = torch.empty((V, d), dtype=torch.float32, device=h.device)
    dgamma = K.f32((d,), h)
    ws = K.workspace("linear_cross_entropy_bwd", h.device, M, V, d, chunk_rows)
    opts = _C.ce_options(ignore_index, reduction, label_smoothing, z_loss, softcap)
    loss = K.f32(K.loss_shape(M, reduction), h) if want_loss else None
    _C.call("linear_cross_entropy_bwd", _d(h), _d(w), _d(rstd), _d(x), _d(gamma), _d(targets), opts,
            _d(grad_loss), chunk_rows, None, _d(dx), _d(dw), _d(dgamma), _d(loss), ws.data_ptr(), ws.numel(),
            _C.stream(h.device))
    return (dx, dw, dgamma, loss) if want_loss else (dx, dw, dgamma)


@reference
def linear_cross_entropy_bwd_f64(h, w, rstd, x, gamma, targets, grad_loss, ignore_index, reduction, label_smoothing,
                                 z_loss, softcap, chunk_rows, want_loss=False):
    l64 = R.rowscale(h, w, rstd)
    loss, dl, _ = _ce(l64, targets, grad_loss, ignore_index, reduction, label_smoothing, z_loss, softcap, True)
    d = h.shape[1]
    zdz = (l64 * dl).sum(-1) / d
    dx, a, dgamma = R.norm_bwd(dl @ R.f64(w), R.f64(x), R.f64(gamma), R.f64(rstd), zdz)
    grads = (dx.to(x.dtype), R.stat_like(dl.T @ a, h), R.stat_like(dgamma, h))
    return grads + (R.stat_like(loss, h),) if want_loss else grads


@kernel
def scale_cast_cuda(src, scale, dtype):
    """out = R(src * scale) into `dtype` (bf16/fp16), the product in fp32, one rounding (the same bits as
    torch.mul(src, scale, out=out)); src fp32 contiguous, scale an fp32 one-element tensor read on the device.
    -> out, src's shape."""
    out = torch.empty(src.shape, dtype=dtype, device=src.device)
    _C.call("scale_cast", _d(src), _d(scale), _d(out), _C.stream(src.device))
    return out
