"""coda.patch_llama on a transformers LlamaForCausalLM: same loss, same gradients for every parameter, same
logits, generate() still works; coda.models.llama loads the HF weights and matches too."""
import copy

import pytest
import torch

import coda
from conftest import accept, requires_gpu

transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install .[test])")


def hf_config(**kw):
    base = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-5, max_position_embeddings=4096,
                rope_theta=500000.0, tie_word_embeddings=True,
                rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 64})
    base.update(kw)
    return transformers.LlamaConfig(**base)


def random_model(cfg, seed=0):
    torch.manual_seed(seed)
    m = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.2 * torch.randn_like(p))
    return m


def token_losses(model, ids, labels, **kw):
    """Per-token next-token losses [valid tokens] (float64, CPU) from the model's logits."""
    with torch.no_grad():
        logits = model(input_ids=ids, **kw).logits.double().cpu()
    t = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].flatten().cpu()
    rows = torch.nn.functional.cross_entropy(logits.flatten(0, 1), t, reduction="none", ignore_index=-100)
    return rows[t != -100]


def loss_and_grads(model, ids, labels, **kw):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels, **kw)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def assert_patch_matches_hf(ref, m, vocab=512):
    """A float64 HF model `ref` and its patched copy `m` on the CPU: the same loss, every parameter's gradient (returned
    names) and the logits. HF's RMSNorm and loss upcast to fp32, so 'float64' HF is fp32-accurate: compare at that
    level."""
    ids = torch.randint(0, vocab, (2, 40))
    labels = ids.clone()
    labels[0, :5] = -100
    l_ref, g_ref = loss_and_grads(ref, ids, labels, use_cache=False)
    l_c, g_c = loss_and_grads(m, ids, labels)
    assert abs(l_c.item() - l_ref.item()) <= 1e-6 * abs(l_ref.item())
    assert set(g_c) == set(g_ref)
    for n in g_ref:
        scale = g_ref[n].abs().max().item()
        assert (g_c[n] - g_ref[n]).abs().max().item() <= 1e-5 * scale + 1e-12, n
    with torch.no_grad():
        lg_ref = ref(input_ids=ids, use_cache=False).logits
        lg = m(input_ids=ids).logits
    assert (lg - lg_ref).abs().max().item() <= 1e-5 * lg_ref.abs().max().item()
    return set(g_ref)


@pytest.mark.parametrize("tie", [True, False])
def test_cpu_patch_matches_hf(tie):
    ref = random_model(hf_config(tie_word_embeddings=tie)).double()
    assert_patch_matches_hf(ref, coda.patch_llama(copy.deepcopy(ref)))


def assert_patch_keeps_generate_and_weights(ref, m, unpatch):
    """Greedy generate() gives the unpatched model's tokens, the state_dict is untouched, `unpatch` restores HF's
    forward."""
    ids = torch.randint(0, 512, (1, 6))
    a = ref.generate(ids, max_new_tokens=5, do_sample=False)
    b = m.generate(ids, max_new_tokens=5, do_sample=False)
    assert torch.equal(a, b)
    sd_a, sd_b = ref.state_dict(), m.state_dict()
    assert set(sd_a) == set(sd_b) and all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)
    assert unpatch(m) is m and m.forward.__func__ is type(m).forward


def test_cpu_patch_keeps_generate_and_weights():
    ref = random_model(hf_config())
    assert_patch_keeps_generate_and_weights(ref, coda.patch_llama(copy.deepcopy(ref)), coda.unpatch_llama)


@pytest.mark.parametrize("keep", [1, 3, "indices", "num_logits_to_keep"])
def test_cpu_patch_logits_to_keep(keep):
    """Last-token scoring (logits_to_keep, or transformers < 4.50's num_logits_to_keep) slices the cached final-norm
    statistics to [B, kept]: the logits match HF's for an int, the old keyword and an index tensor."""
    ref = random_model(hf_config()).double()
    m = coda.patch_llama(copy.deepcopy(ref))
    ids = torch.randint(0, 512, (2, 9))
    if keep == "num_logits_to_keep":
        kw_ref, kw = dict(logits_to_keep=2), dict(num_logits_to_keep=2)
    else:
        k = torch.tensor([0, 4, 8]) if keep == "indices" else keep
        kw_ref = kw = dict(logits_to_keep=k)
    with torch.no_grad():
        a = ref(input_ids=ids, use_cache=False, **kw_ref).logits
        b = m(input_ids=ids, **kw).logits
    assert a.shape == b.shape
    assert (a - b).abs().max().item() <= 1e-5 * a.abs().max().item()


@pytest.mark.parametrize("kw", [dict(use_cache=False), dict(use_cache=False, num_beams=2),
                                dict(num_beams=2), dict()], ids=["nocache", "beam-nocache", "beam", "cache"])
def test_cpu_patch_generate_paths(kw):
    """generate() with and without a KV cache, greedy and beam search: the same tokens as the unpatched model."""
    ref = random_model(hf_config())
    m = coda.patch_llama(copy.deepcopy(ref))
    ids = torch.randint(0, 512, (2, 6))
    mask = torch.ones_like(ids)
    a = ref.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0, **kw)
    b = m.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0, **kw)
    assert torch.equal(a, b)


def test_cpu_patch_padding_mask_and_positions():
    """Right padding with attention_mask: the real tokens' loss matches HF's."""
    ref = random_model(hf_config()).double()
    m = coda.patch_llama(copy.deepcopy(ref))
    ids = torch.randint(0, 512, (2, 24))
    mask = torch.ones_like(ids)
    mask[1, 16:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    a = ref(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss
    b = m(input_ids=ids, attention_mask=mask, labels=labels).loss
    assert abs(a.item() - b.item()) <= 1e-6 * abs(a.item())


def test_patch_refuses_unsupported_config():
    m = random_model(hf_config(mlp_bias=True))
    with pytest.raises(ValueError, match="mlp_bias"):
        coda.patch_llama(m)
    assert getattr(m, "_coda_original_forward", None) is None


def test_cpu_models_llama_matches_hf():
    ref = random_model(hf_config(tie_word_embeddings=False)).double()
    cm = coda.models.llama.LlamaForCausalLM(coda.models.llama.LlamaConfig.from_hf(ref.config), dtype=torch.float64)
    cm.load_state_dict(ref.state_dict(), strict=True)
    ids = torch.randint(0, 512, (2, 33))
    l_ref, g_ref = loss_and_grads(ref, ids, ids, use_cache=False)
    cm.zero_grad()
    loss = cm(ids, labels=ids).loss
    loss.backward()
    assert abs(loss.item() - l_ref.item()) <= 1e-6 * abs(l_ref.item())
    # gradients in HF layout: through the state-dict hooks' inverse permutation
    grads = {n: p.grad for n, p in cm.named_parameters()}
    q = g_ref["model.layers.1.self_attn.q_proj.weight"]
    got = coda.layout.unpair_rope_rows(grads["model.layers.1.self_attn.w_qkv"][: q.shape[0]], 64)
    assert (got - q).abs().max().item() <= 1e-5 * q.abs().max().item()


GPU_MODELS = {
    "llama32-1b-2layers": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=2,
                               num_attention_heads=32, num_key_value_heads=8, head_dim=64),
    # a vocabulary after adding special tokens: not a multiple of 8
    "vocab32003": dict(vocab_size=32003, hidden_size=1024, intermediate_size=2048, num_hidden_layers=2,
                       num_attention_heads=8, num_key_value_heads=2, head_dim=128, tie_word_embeddings=False),
}


@requires_gpu
@pytest.mark.parametrize("dtype,model", [(torch.bfloat16, "llama32-1b-2layers"), (torch.bfloat16, "vocab32003"),
                                         (torch.float16, "vocab32003")])
def test_gpu_patch_llama32_1b_like(dtype, model):
    """Llama-shaped models with 2 layers: loss and every parameter's gradient of the patched model pass the
    acceptance rule against the float64 (CPU) model, with unpatched HF in the same dtype on the GPU as 'unfused'."""
    cfg = hf_config(**GPU_MODELS[model])
    base = random_model(cfg).to(dtype)  # the float64 model below holds exactly these (rounded) weights
    ids = torch.randint(0, cfg.vocab_size, (2, 256))
    labels = ids.clone()
    labels[:, :10] = -100
    l64, g64 = loss_and_grads(copy.deepcopy(base).double(), ids, labels, use_cache=False)
    hf = copy.deepcopy(base).to("cuda", dtype)
    l_u, g_u = loss_and_grads(hf, ids.cuda(), labels.cuda(), use_cache=False)
    m = coda.patch_llama(copy.deepcopy(base).to("cuda", dtype))
    l_c, g_c = loss_and_grads(m, ids.cuda(), labels.cuda())
    # The loss is one number, whose error against another's is a coin flip (conftest.check_reduced_loss): the rule
    # applies to the per-token losses (from each model's logits), and the mean loss of the training path must be
    # within 2x the unfused model's per-token error budget.
    r_rows = token_losses(copy.deepcopy(base).double(), ids, labels, use_cache=False)
    u_rows = token_losses(hf, ids.cuda(), labels.cuda(), use_cache=False)
    del hf
    c_rows = token_losses(m, ids.cuda(), labels.cuda())
    accept("per-token loss", c_rows, u_rows, r_rows)
    e, budget = abs(l_c.item() - l64.item()), (u_rows - r_rows).abs().mean().item()
    ulps = 2 * torch.finfo(torch.float32).eps * abs(l64.item())
    print(f"  mean loss: coda {e:.3e}  unfused {abs(l_u.item() - l64.item()):.3e}  per-token budget {budget:.3e}")
    assert e <= 2 * budget + ulps + 1e-6
    for n in g64:
        accept(f"d {n}", g_c[n], g_u[n], g64[n], row_sum=True)  # a parameter's gradient sums over tokens
    out = m.generate(ids[:1, :8].cuda(), max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 12)
    out = m.generate(ids[:1, :8].cuda(), max_new_tokens=4, do_sample=False, use_cache=False)
    assert out.shape == (1, 12)
    with torch.no_grad():
        last = m(input_ids=ids.cuda(), logits_to_keep=1).logits
        full = m(input_ids=ids.cuda()).logits
    assert last.shape == (2, 1, cfg.vocab_size)
    assert (last[:, 0] - full[:, -1]).abs().max().item() <= 1e-2 * full[:, -1].abs().max().item()


def test_cpu_patch_under_autocast():
    """fp32 weights + torch.autocast (how HF's Trainer trains in bf16): the patched model runs in the autocast dtype
    and its loss matches the unpatched model's under the same autocast to bf16 noise."""
    ref = random_model(hf_config(num_hidden_layers=2))
    m = coda.patch_llama(copy.deepcopy(ref))
    ids = torch.randint(0, 512, (2, 32))
    with torch.autocast("cpu", torch.bfloat16):
        a = ref(input_ids=ids, labels=ids, use_cache=False).loss
        b = m(input_ids=ids, labels=ids).loss
    b.backward()
    assert abs(a.item() - b.item()) <= 2e-2 * abs(a.item())
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in m.parameters())
