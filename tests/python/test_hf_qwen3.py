"""coda.patch_qwen3 on a transformers Qwen3ForCausalLM (QK-norm: a per-head RMSNorm of q and k before RoPE): same
loss, same gradients for every parameter (the q_norm / k_norm weights included), same logits, generate() and the
weights untouched; patch_llama and patch_qwen3 refuse each other's models; ops.rmsnorm_qkv_qk_norm_rope against the
float64 reference of MATH.md "linear_rowscale_qk_norm_rope"."""
import copy

import pytest
import torch

import coda
from coda import _reference as ref64
from conftest import accept, requires_gpu
from test_hf import assert_patch_keeps_generate_and_weights, assert_patch_matches_hf, loss_and_grads, token_losses

transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install .[test])")
qwen3 = pytest.importorskip("transformers.models.qwen3.modeling_qwen3", reason="transformers without Qwen3")


def qwen3_config(**kw):
    base = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6, max_position_embeddings=4096,
                rope_theta=1000000.0, tie_word_embeddings=True)
    base.update(kw)
    return qwen3.Qwen3Config(**base)


def random_model(cfg, seed=0):
    torch.manual_seed(seed)
    m = qwen3.Qwen3ForCausalLM(cfg)
    with torch.no_grad():  # every norm's gamma away from 1, so a wrong layout or a missing norm shows
        for n, p in m.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.2 * torch.randn_like(p))
    return m


@pytest.mark.parametrize("qk_norm_block", [False, True], ids=["per_layer", "block"])
@pytest.mark.parametrize("tie", [True, False])
def test_cpu_patch_qwen3_matches_hf(tie, qk_norm_block, monkeypatch):
    """Both paths of stack.run_layers for a QK-norm layer: the per-layer ops and (QK_NORM_BLOCK) the cross-layer block
    with its QK-norm (block.h version 2)."""
    monkeypatch.setattr(coda.models.stack, "QK_NORM_BLOCK", qk_norm_block)
    calls = []
    real = coda.ops.block
    monkeypatch.setattr(coda.ops, "block", lambda *a, **k: calls.append(k.get("q_gamma")) or real(*a, **k))
    ref = random_model(qwen3_config(tie_word_embeddings=tie)).double()
    names = assert_patch_matches_hf(ref, coda.patch_qwen3(copy.deepcopy(ref)))
    assert any("q_norm" in n for n in names) and any("k_norm" in n for n in names)
    assert (len(calls) > 0 and all(q is not None for q in calls)) == qk_norm_block


def test_cpu_patch_qwen3_layer_by_layer(monkeypatch):
    """HF's gradient checkpointing runs the layers one by one (stack.layer_forward, each on its own weights): the same
    loss and gradients as the unpatched model."""
    calls = []
    real = coda.hf.layer_forward
    monkeypatch.setattr(coda.hf, "layer_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    ref = random_model(qwen3_config(num_hidden_layers=2)).double()
    m = coda.patch_qwen3(copy.deepcopy(ref))
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    m.train()
    ref.train()
    ids = torch.randint(0, 512, (2, 24))
    l_ref, g_ref = loss_and_grads(ref, ids, ids, use_cache=False)
    l_c, g_c = loss_and_grads(m, ids, ids)
    assert len(calls) >= 2  # the layer-by-layer path ran (the forward, and the checkpoint's recomputation)
    assert abs(l_c.item() - l_ref.item()) <= 1e-6 * abs(l_ref.item())
    for n in g_ref:
        assert (g_c[n] - g_ref[n]).abs().max().item() <= 1e-5 * g_ref[n].abs().max().item() + 1e-12, n


def test_cpu_patch_qwen3_keeps_generate_and_weights():
    ref = random_model(qwen3_config())
    assert_patch_keeps_generate_and_weights(ref, coda.patch_qwen3(copy.deepcopy(ref)), coda.unpatch_qwen3)


def test_patches_refuse_each_others_models():
    q = random_model(qwen3_config(num_hidden_layers=1))
    with pytest.raises(ValueError, match="QK-norm.*patch_qwen3"):
        coda.patch_llama(q)
    assert getattr(q, "_coda_original_forward", None) is None
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, head_dim=64))
    with pytest.raises(ValueError, match="no q_norm.*patch_llama"):
        coda.patch_qwen3(llama)
    assert getattr(llama, "_coda_original_forward", None) is None


def test_patch_qwen3_refuses_mixture_of_experts():
    moe = pytest.importorskip("transformers.models.qwen3_moe.modeling_qwen3_moe",
                              reason="transformers without Qwen3MoE")
    cfg = moe.Qwen3MoeConfig(vocab_size=64, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                             num_experts=4, num_experts_per_tok=2, num_hidden_layers=1, num_attention_heads=2,
                             num_key_value_heads=2, head_dim=64)
    m = moe.Qwen3MoeForCausalLM(cfg)
    with pytest.raises(ValueError, match="mixture of experts"):
        coda.patch_qwen3(m)
    assert getattr(m, "_coda_original_forward", None) is None


def test_patch_qwen3_refuses_sliding_window():
    m = random_model(qwen3_config(num_hidden_layers=2, use_sliding_window=True, sliding_window=16,
                                  max_window_layers=0))
    with pytest.raises(ValueError, match="sliding-window"):
        coda.patch_qwen3(m)
    assert getattr(m, "_coda_original_forward", None) is None


def test_cpu_rmsnorm_qkv_qk_norm_rope_matches_the_reference():
    """The op against MATH.md's float64 composition: rmsnorm, the GEMM, the per-head norm, RoPE."""
    torch.manual_seed(3)
    hq, hkv, hd, d, M = 4, 2, 64, 96, 9
    W = (hq + 2 * hkv) * hd
    x = torch.randn(M, d, dtype=torch.float64)
    gamma = torch.empty(d, dtype=torch.float64).uniform_(0.5, 1.5)
    w_qkv = 0.1 * torch.randn(W, d, dtype=torch.float64)
    q_gamma = torch.empty(hd, dtype=torch.float64).uniform_(0.5, 1.5)
    k_gamma = torch.empty(hd, dtype=torch.float64).uniform_(0.5, 1.5)
    positions = torch.tensor([0, 1, 2, 7, 300, 4096, 65535, 5, 9], dtype=torch.int32)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    eps, qk_eps = 1e-5, 1e-6
    got = coda.ops.rmsnorm_qkv_qk_norm_rope(x, gamma, w_qkv, q_gamma, k_gamma, positions, inv_freq, hq, hkv, hd,
                                             eps, qk_eps)
    z = (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * gamma) @ w_qkv.T
    want, _ = ref64.qk_norm_rope(z, positions, inv_freq, q_gamma, k_gamma, qk_eps, hq, hkv, hd)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_rmsnorm_qkv_qk_norm_rope_checks_its_arguments():
    hq, hkv, hd, d = 2, 1, 64, 32
    x = torch.randn(3, d, dtype=torch.float64)
    gamma = torch.ones(d, dtype=torch.float64)
    w = torch.randn((hq + 2 * hkv) * hd, d, dtype=torch.float64)
    g = torch.ones(hd, dtype=torch.float64)
    pos = torch.arange(3, dtype=torch.int32)
    inv = torch.ones(hd // 2, dtype=torch.float64)
    op = coda.ops.rmsnorm_qkv_qk_norm_rope
    with pytest.raises(ValueError, match="`k_gamma`"):
        op(x, gamma, w, g, g[:-2], pos, inv, hq, hkv, hd)
    with pytest.raises(ValueError, match="`qk_eps` must be > 0"):
        op(x, gamma, w, g, g, pos, inv, hq, hkv, hd, 1e-6, 0.0)
    with pytest.raises(ValueError, match="`head_dim` must be 64 or 128"):
        op(x, gamma, w, g, g, pos, inv, hq, hkv, 32)
    with pytest.raises(TypeError, match="`q_gamma` must be floating point"):
        op(x, gamma, w, torch.ones(hd, dtype=torch.int32), g, pos, inv, hq, hkv, hd)


@requires_gpu
@pytest.mark.parametrize("qk_norm_block", [False, True], ids=["per_layer", "block"])
def test_gpu_patch_qwen3(qk_norm_block, monkeypatch):
    """A 2-layer Qwen3 in bf16: loss and every parameter's gradient of the patched model pass the acceptance rule
    against the float64 (CPU) model, with unpatched HF in bf16 on the GPU as 'unfused'; through the per-layer ops
    and through the cross-layer block (stack.QK_NORM_BLOCK)."""
    monkeypatch.setattr(coda.models.stack, "QK_NORM_BLOCK", qk_norm_block)
    cfg = qwen3_config(vocab_size=2048, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                       num_attention_heads=8, num_key_value_heads=4, head_dim=128)
    base = random_model(cfg).to(torch.bfloat16)
    ids = torch.randint(0, cfg.vocab_size, (2, 256))
    labels = ids.clone()
    labels[:, :10] = -100
    l64, g64 = loss_and_grads(copy.deepcopy(base).double(), ids, labels, use_cache=False)
    hf = copy.deepcopy(base).to("cuda")
    l_u, g_u = loss_and_grads(hf, ids.cuda(), labels.cuda(), use_cache=False)
    m = coda.patch_qwen3(copy.deepcopy(base).to("cuda"))
    l_c, g_c = loss_and_grads(m, ids.cuda(), labels.cuda())
    # As test_hf.test_gpu_patch_llama32_1b_like: the rule on the per-token losses, the mean loss within 2x the
    # unfused model's per-token error budget.
    r_rows = token_losses(copy.deepcopy(base).double(), ids, labels, use_cache=False)
    u_rows = token_losses(hf, ids.cuda(), labels.cuda(), use_cache=False)
    c_rows = token_losses(m, ids.cuda(), labels.cuda())
    accept("per-token loss", c_rows, u_rows, r_rows)
    e, budget = abs(l_c.item() - l64.item()), (u_rows - r_rows).abs().mean().item()
    print(f"  mean loss: coda {e:.3e}  unfused {abs(l_u.item() - l64.item()):.3e}  per-token budget {budget:.3e}")
    assert e <= 2 * budget + 2 * torch.finfo(torch.float32).eps * abs(l64.item()) + 1e-6
    for n in g64:
        accept(f"d {n}", g_c[n], g_u[n], g64[n], row_sum=True)
    out = m.generate(ids[:1, :8].cuda(), max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 12)
