"""QK-norm + RoPE (Qwen3's attention input), the float64 references on the CPU: the forward against HF's Qwen3
attention (in CODA's layout, W_q, W_k rows and the norms' gammas permuted so RoPE pairs are adjacent, MATH.md
"linear_rowscale_qk_norm_rope", it computes what HF computes on its own layout), the backward against autograd of
the forward."""
import pytest
import torch

import coda
from coda import _reference as ref


@pytest.mark.parametrize("n_q_heads,n_kv_heads,head_dim", [(4, 2, 16), (2, 2, 8)])
def test_qk_norm_rope_matches_hf_qwen3(n_q_heads, n_kv_heads, head_dim):
    qwen3 = pytest.importorskip("transformers.models.qwen3.modeling_qwen3")
    cfg = qwen3.Qwen3Config(hidden_size=48, num_attention_heads=n_q_heads, num_key_value_heads=n_kv_heads,
                            head_dim=head_dim, intermediate_size=64, num_hidden_layers=1, vocab_size=32,
                            rms_norm_eps=1e-6)
    torch.manual_seed(0)
    attn = qwen3.Qwen3Attention(cfg, layer_idx=0).double()
    with torch.no_grad():  # gammas away from 1, so a wrong permutation shows
        attn.q_norm.weight.uniform_(0.5, 1.5)
        attn.k_norm.weight.uniform_(0.5, 1.5)
    M = 7
    x = torch.randn(1, M, cfg.hidden_size, dtype=torch.float64)
    # Small positions: HF forms its angles in float32 (an error of ~pos * 6e-8 rad).
    positions = torch.tensor([0, 1, 2, 3, 17, 18, 9], dtype=torch.int32)
    rotary = qwen3.Qwen3RotaryEmbedding(cfg)
    cos, sin = rotary(x, positions[None].long())
    with torch.no_grad():
        shape = (1, M, -1, head_dim)
        q = attn.q_norm(attn.q_proj(x).view(shape)).transpose(1, 2)
        k = attn.k_norm(attn.k_proj(x).view(shape)).transpose(1, 2)
        q, k = qwen3.apply_rotary_pos_emb(q, k, cos.double(), sin.double())
        v = attn.v_proj(x)
        w_qkv = coda.layout.qkv_weight(attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, head_dim)
        q_gamma = coda.layout.pair_rope_rows(attn.q_norm.weight, head_dim)
        k_gamma = coda.layout.pair_rope_rows(attn.k_norm.weight, head_dim)
    z = x[0] @ w_qkv.T
    inv_freq = rotary.inv_freq.double()  # float-valued, as CODA's callers upload it
    qkv, head_rstd = ref.qk_norm_rope(z, positions, inv_freq, q_gamma, k_gamma, cfg.rms_norm_eps, n_q_heads,
                                      n_kv_heads, head_dim)
    q_c, k_c, v_c = torch.split(qkv, [n_q_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim], dim=1)
    q_c = coda.layout.unpair_rope_rows(q_c.T, head_dim).T  # back to HF's column order
    k_c = coda.layout.unpair_rope_rows(k_c.T, head_dim).T
    # HF's Qwen3RMSNorm normalises in float32 and its rotary tables are float32: agreement to float32 precision.
    tol = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(q_c, q[0].transpose(0, 1).reshape(M, -1), **tol)
    torch.testing.assert_close(k_c, k[0].transpose(0, 1).reshape(M, -1), **tol)
    torch.testing.assert_close(v_c, v[0], rtol=1e-12, atol=1e-12)
    u = z[:, : (n_q_heads + n_kv_heads) * head_dim].reshape(M, -1, head_dim)
    torch.testing.assert_close(head_rstd, torch.rsqrt(u.square().mean(-1) + cfg.rms_norm_eps), rtol=1e-12, atol=0)


@pytest.mark.parametrize("n_q_heads,n_kv_heads,head_dim,eps", [(4, 2, 8, 1e-2), (2, 1, 16, 1e-6)])
def test_qk_norm_rope_bwd_is_the_gradient(n_q_heads, n_kv_heads, head_dim, eps):
    torch.manual_seed(1)
    M, hidden = 6, 40
    W = (n_q_heads + 2 * n_kv_heads) * head_dim
    z = (0.2 * torch.randn(M, W, dtype=torch.float64)).requires_grad_()  # small: eps matters at 1e-2
    q_gamma = torch.empty(head_dim, dtype=torch.float64).uniform_(0.5, 1.5).requires_grad_()
    k_gamma = torch.empty(head_dim, dtype=torch.float64).uniform_(0.5, 1.5).requires_grad_()
    positions = torch.tensor([0, 1, 7, 4096, 131071, 3], dtype=torch.int32)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    qkv, _ = ref.qk_norm_rope(z, positions, inv_freq, q_gamma, k_gamma, eps, n_q_heads, n_kv_heads, head_dim)
    dqkv = torch.randn(M, W, dtype=torch.float64)
    want = torch.autograd.grad((qkv * dqkv).sum(), (z, q_gamma, k_gamma))
    dz, zdz, dq_gamma, dk_gamma = ref.qk_norm_rope_bwd(z.detach(), qkv.detach(), dqkv, positions, inv_freq,
                                                       q_gamma.detach(), k_gamma.detach(), eps, n_q_heads,
                                                       n_kv_heads, head_dim, hidden)
    for got, exp in zip((dz, dq_gamma, dk_gamma), want):
        torch.testing.assert_close(got, exp, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(zdz, (z.detach() * dz).sum(-1) / hidden, rtol=1e-12, atol=1e-14)
