"""coda.layout permutations and the HF <-> CODA state_dict hooks of coda.nn / coda.models (CPU)."""
import torch

import coda
from coda.models.llama import LlamaConfig, LlamaForCausalLM


def test_pair_rope_rows_definition_and_inverse():
    hd, H, K = 8, 3, 5
    w = torch.randn(H * hd, K)
    p = coda.layout.pair_rope_rows(w, hd)
    for h in range(H):
        for i in range(hd // 2):
            assert torch.equal(p[h * hd + 2 * i], w[h * hd + i])
            assert torch.equal(p[h * hd + 2 * i + 1], w[h * hd + i + hd // 2])
    assert torch.equal(coda.layout.unpair_rope_rows(p, hd), w)


def test_interleave_gate_up_definition_and_inverse():
    g, u = torch.randn(6, 4), torch.randn(6, 4)
    w = coda.layout.interleave_gate_up(g, u)
    assert torch.equal(w[0::2], g) and torch.equal(w[1::2], u)
    g2, u2 = coda.layout.deinterleave_gate_up(w)
    assert torch.equal(g2, g) and torch.equal(u2, u)


def test_qkv_weight_round_trip():
    q, k, v = torch.randn(4 * 64, 16), torch.randn(2 * 64, 16), torch.randn(2 * 64, 16)
    w = coda.layout.qkv_weight(q, k, v, 64)
    for a, b in zip(coda.layout.split_qkv_weight(w, 4, 2, 64), (q, k, v)):
        assert torch.equal(a, b)


def test_module_state_dict_is_hf_layout():
    m = coda.nn.SwiGLUMLP(16, 24)
    sd = m.state_dict()
    assert set(sd) == {"norm_weight", "gate_proj.weight", "up_proj.weight", "down_proj.weight"}
    assert torch.equal(sd["gate_proj.weight"], m.w_gu[0::2]) and torch.equal(sd["up_proj.weight"], m.w_gu[1::2])
    m2 = coda.nn.SwiGLUMLP(16, 24)
    m2.load_state_dict(sd)
    assert torch.equal(m2.w_gu, m.w_gu)
    a = coda.nn.RMSNormQKVRope(32, 2, 1, 64)
    sd = a.state_dict()
    assert set(sd) == {"norm_weight", "q_proj.weight", "k_proj.weight", "v_proj.weight"}
    b = coda.nn.RMSNormQKVRope(32, 2, 1, 64)
    b.load_state_dict(sd)
    assert torch.equal(a.w_qkv, b.w_qkv)
    q = coda.nn.RMSNormQKVQKNormRope(32, 2, 1, 64)  # Qwen3's: the q/k norms in HF's names and order too
    with torch.no_grad():
        q.q_norm.weight.copy_(torch.arange(64.0))
    sd = q.state_dict()
    assert set(sd) == {"norm_weight", "q_proj.weight", "k_proj.weight", "v_proj.weight", "q_norm.weight",
                       "k_norm.weight"}
    assert torch.equal(sd["q_norm.weight"], torch.arange(64.0))
    r = coda.nn.RMSNormQKVQKNormRope(32, 2, 1, 64)
    r.load_state_dict(sd, strict=True)
    assert torch.equal(r.w_qkv, q.w_qkv) and torch.equal(r.q_norm.weight, q.q_norm.weight)


def test_llama_block_state_dict_keys():
    blk = coda.nn.LlamaBlock(64, 96, 2, 1, 64)
    keys = set(blk.state_dict())
    assert {"next_q_proj.weight", "next_k_proj.weight", "next_v_proj.weight", "gate_proj.weight",
            "up_proj.weight", "down_proj.weight", "o_proj.weight"} <= keys
    other = coda.nn.LlamaBlock(64, 96, 2, 1, 64)
    other.load_state_dict(blk.state_dict(), strict=True)
    assert torch.equal(other.next_w_qkv, blk.next_w_qkv) and torch.equal(other.w_gu, blk.w_gu)


def test_model_state_dict_round_trip():
    """An HF-layout state dict loads (strict) and saves back identically."""
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64, tie_word_embeddings=False)
    src = LlamaForCausalLM(cfg)
    hf_sd = {k: v.clone() for k, v in src.state_dict().items()}
    assert "model.layers.0.self_attn.q_proj.weight" in hf_sd and "model.layers.1.mlp.up_proj.weight" in hf_sd
    assert not any("w_qkv" in k or "w_gu" in k for k in hf_sd)
    dst = LlamaForCausalLM(cfg)
    dst.load_state_dict(hf_sd, strict=True)
    out = dst.state_dict()
    assert set(out) == set(hf_sd) and all(torch.equal(out[k], hf_sd[k]) for k in hf_sd)
    # the CODA-layout parameters themselves were permuted, not copied as-is
    q = hf_sd["model.layers.0.self_attn.q_proj.weight"]
    assert torch.equal(dst.model.layers[0].self_attn.w_qkv[: q.shape[0]], coda.layout.pair_rope_rows(q, 64))


def test_pair_rope_rows_of_a_gamma_vector():
    """A [head_dim] QK-norm gamma takes the rows' permutation (what hf.py and nn.py apply to q_norm / k_norm)."""
    hd = 8
    g = torch.arange(hd, dtype=torch.float32)
    paired = coda.layout.pair_rope_rows(g, hd)
    assert paired.tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert torch.equal(paired, coda.layout.pair_rope_rows(g[:, None], hd)[:, 0])
    assert torch.equal(coda.layout.unpair_rope_rows(paired, hd), g)
