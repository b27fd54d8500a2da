"""Plain PyTorch versions of what CODA fuses, in HF/PyTorch style: the 'unfused' pipeline of the acceptance rule
(run in bf16/fp16 on the GPU) and the float64 reference (run in float64 on the CPU). Weights in CODA's layouts
(gate/up interleaved, q/k rows RoPE-paired), so they take exactly the tensors coda.ops takes."""
import torch
import torch.nn.functional as F


def rms_norm(x, gamma, eps):
    return F.rms_norm(x, (x.shape[-1],), gamma, eps)


def rmsnorm_linear(x, gamma, w, eps):
    return rms_norm(x, gamma, eps) @ w.T


def rope_pairs(z, positions, inv_freq, n_rot_heads, hd):
    """Rotates the first n_rot_heads heads of z [..., W] with pairs (2i, 2i+1) adjacent."""
    theta = positions[..., None].to(torch.float64) * inv_freq.to(torch.float64)
    cos, sin = torch.cos(theta).to(z.dtype)[..., None, :], torch.sin(theta).to(z.dtype)[..., None, :]
    rot = z[..., : n_rot_heads * hd].unflatten(-1, (n_rot_heads, hd // 2, 2))
    even, odd = rot[..., 0], rot[..., 1]
    out = torch.stack((even * cos - odd * sin, odd * cos + even * sin), -1).flatten(-3)
    return torch.cat((out, z[..., n_rot_heads * hd:]), -1)


def rmsnorm_qkv_rope(x, gamma, w_qkv, positions, inv_freq, hq, hkv, hd, eps):
    return rope_pairs(rmsnorm_linear(x, gamma, w_qkv, eps), positions, inv_freq, hq + hkv, hd)


def qk_norm_rope(z, q_gamma, k_gamma, positions, inv_freq, hq, hkv, hd, eps):
    """Per-head RMSNorm of z's q and k heads (gammas in the paired order) then RoPE; v heads pass through."""
    n_rot = hq + hkv
    heads = z[..., : n_rot * hd].unflatten(-1, (n_rot, hd))
    g = torch.cat((q_gamma.expand(hq, hd), k_gamma.expand(hkv, hd)))
    normed = (rms_norm(heads, torch.ones(hd, dtype=z.dtype, device=z.device), eps) * g).flatten(-2)
    return rope_pairs(torch.cat((normed, z[..., n_rot * hd:]), dim=-1), positions, inv_freq, n_rot, hd)


def rmsnorm_qkv_qk_norm_rope(x, gamma, w_qkv, q_gamma, k_gamma, positions, inv_freq, hq, hkv, hd, eps):
    """qk_norm_rope after the input norm and the QKV projection (the norm's eps for both)."""
    return qk_norm_rope(rmsnorm_linear(x, gamma, w_qkv, eps), q_gamma, k_gamma, positions, inv_freq, hq, hkv, hd,
                        eps)


def qk_norm_rope_bwd(z, dqkv, q_gamma, k_gamma, positions, inv_freq, hq, hkv, hd, eps, dtype=torch.float32):
    """qk_norm_rope's backward by PyTorch autograd in `dtype`: -> (dz, dq_gamma, dk_gamma) in `dtype`."""
    z, qg, kg = (t.detach().to(dtype).requires_grad_() for t in (z, q_gamma, k_gamma))
    qkv = qk_norm_rope(z, qg, kg, positions, inv_freq, hq, hkv, hd, eps)
    return torch.autograd.grad(qkv, (z, qg, kg), dqkv.to(dtype))


def swiglu_mlp(x, gamma, w_gu, w_down, eps):
    z = rmsnorm_linear(x, gamma, w_gu, eps)
    return x + (F.silu(z[..., 0::2]) * z[..., 1::2]) @ w_down.T


def block(y0, x0, w_o, gamma1, w_gu, w_down, gamma2, w_qkv, positions, inv_freq, hq, hkv, hd, eps, q_gamma=None,
          k_gamma=None, qk_eps=None):
    x1 = y0 @ w_o.T + x0
    x2 = swiglu_mlp(x1, gamma1, w_gu, w_down, eps)
    if q_gamma is not None:
        z = rmsnorm_linear(x2, gamma2, w_qkv, eps)
        qk_eps = eps if qk_eps is None else qk_eps
        return x2, qk_norm_rope(z, q_gamma, k_gamma, positions, inv_freq, hq, hkv, hd, qk_eps)
    return x2, rmsnorm_qkv_rope(x2, gamma2, w_qkv, positions, inv_freq, hq, hkv, hd, eps)


def cross_entropy(logits, targets, ignore_index=-100, reduction="mean", label_smoothing=0.0, z_loss=0.0,
                  softcap=None):
    l = logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits
    if softcap:
        l = softcap * torch.tanh(l / softcap)
    loss = F.cross_entropy(l, targets, ignore_index=ignore_index, reduction="none", label_smoothing=label_smoothing)
    if z_loss:
        keep = targets != ignore_index
        loss = loss + z_loss * torch.logsumexp(l, -1).square() * keep
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    n = (targets != ignore_index).sum()
    return loss.sum() / n.clamp(min=1)


def linear_cross_entropy(x, gamma, w, targets, eps, **options):
    return cross_entropy(rmsnorm_linear(x, gamma, w, eps), targets, **options)
