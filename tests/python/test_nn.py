"""coda.nn modules and coda.models.llama, forward and backward, against plain PyTorch: on the CPU (float64
reference path) and on the GPU (bf16 kernels, acceptance rule for the output and every parameter's gradient)."""
import pytest
import torch
import torch.nn.functional as F

import coda
import inputs as I
import plain
from conftest import accept, close64, requires_gpu

EPS = 1e-5


def _fill(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in module.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g, dtype=torch.float64))
            else:
                p.copy_(0.02 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    return module


def _plain_forward(module, x, extra):
    """The plain PyTorch computation of each module, on its parameters (CODA layouts)."""
    if isinstance(module, coda.nn.RMSNormLinear):
        return plain.rmsnorm_linear(x, module.norm_weight, module.weight, EPS)
    if isinstance(module, coda.nn.SwiGLUMLP):
        return plain.swiglu_mlp(x, module.norm_weight, module.w_gu, module.down_proj.weight, EPS)
    if isinstance(module, coda.nn.RMSNormQKVQKNormRope):
        pair = (lambda w: coda.layout.pair_rope_rows(w, module.head_dim))
        return plain.rmsnorm_qkv_qk_norm_rope(x, module.norm_weight, module.w_qkv, pair(module.q_norm.weight),
                                               pair(module.k_norm.weight), *extra, module.n_q_heads,
                                               module.n_kv_heads, module.head_dim, EPS)
    if isinstance(module, coda.nn.RMSNormQKVRope):
        return plain.rmsnorm_qkv_rope(x, module.norm_weight, module.w_qkv, *extra, module.n_q_heads,
                                       module.n_kv_heads, module.head_dim, EPS)
    if isinstance(module, coda.nn.LlamaBlock):
        m = module
        return plain.block(extra[0], x, m.o_proj.weight, m.post_attention_layernorm.weight, m.w_gu,
                           m.down_proj.weight, m.next_input_layernorm.weight, m.next_w_qkv, *extra[1:],
                           m.n_q_heads, m.n_kv_heads, m.head_dim, EPS)
    raise TypeError(module)


def _coda_forward(module, x, extra):
    if isinstance(module, coda.nn.SwiGLUMLP):
        return module(x)[0]
    if isinstance(module, coda.nn.LlamaBlock):
        return module(extra[0], x, *extra[1:])
    return module(x, *extra)


def _modules(d=64, hq=2, hkv=1, hd=64):
    return {
        "RMSNormLinear": (lambda **k: coda.nn.RMSNormLinear(d, 48, EPS, **k), d),
        "SwiGLUMLP": (lambda **k: coda.nn.SwiGLUMLP(d, 96, EPS, **k), d),
        "RMSNormQKVRope": (lambda **k: coda.nn.RMSNormQKVRope(d, hq, hkv, hd, EPS, **k), d),
        "RMSNormQKVQKNormRope": (lambda **k: coda.nn.RMSNormQKVQKNormRope(d, hq, hkv, hd, EPS, **k), d),
        "LlamaBlock": (lambda **k: coda.nn.LlamaBlock(d, 96, hq, hkv, hd, EPS, **k), d),
    }


def _extra(name, M, device, dtype, hq=2, hd=64):
    g = I.gen(7)
    pos, inv = I.positions(g, M).to(device), I.inv_freq(hd).float().to(device)
    if name in ("RMSNormQKVRope", "RMSNormQKVQKNormRope"):
        return (pos, inv)
    if name == "LlamaBlock":
        return (I.act(g, M, hq * hd).detach().to(device, dtype), pos, inv)
    return ()


def _run(module, x, extra, fn):
    module.zero_grad(set_to_none=True)
    out = fn(module, x, extra)
    outs = out if isinstance(out, tuple) else (out,)
    g = torch.Generator().manual_seed(3)
    loss = sum((o * torch.randn(o.shape, generator=g).to(torch.bfloat16).to(o.device, o.dtype)).sum() for o in outs)
    loss.backward()
    return [o.detach() for o in outs], {n: p.grad.detach().clone() for n, p in module.named_parameters()}


@pytest.mark.parametrize("name", list(_modules()))
def test_cpu_module_matches_plain(name):
    make, d = _modules()[name]
    m = _fill(make(dtype=torch.float64), 1)
    x = I.act(I.gen(2), 9, d).detach()
    o_c, g_c = _run(m, x, _extra(name, 9, "cpu", torch.float64), _coda_forward)
    o_r, g_r = _run(m, x, _extra(name, 9, "cpu", torch.float64), _plain_forward)
    for a, b in zip(o_c, o_r):
        close64(name, a, b)
    for n in g_r:
        close64(f"{name}.{n}", g_c[n], g_r[n])


def test_cpu_linear_cross_entropy_loss_module():
    g = I.gen(4)
    x, gm, w = I.act(g, 11, 32), I.norm(g, 32), I.weight(g, 64, 32)
    t = torch.randint(0, 64, (11,), generator=g)
    mod = coda.nn.LinearCrossEntropyLoss(EPS, label_smoothing=0.1)
    a = mod(x, gm, w, t)
    b = plain.linear_cross_entropy(x, gm, w, t, EPS, label_smoothing=0.1)
    close64("loss", a, b)


@requires_gpu
@pytest.mark.parametrize("name", list(_modules(256, 4, 2, 64)))
def test_gpu_module(name):
    make, d = _modules(256, 4, 2, 64)[name]
    base = _fill(make(dtype=torch.float64), 1)
    with torch.no_grad():
        for p in base.parameters():
            p.copy_(p.to(torch.bfloat16).double())
    x64 = I.act(I.gen(2), 1000, d).detach().to(torch.bfloat16).double()
    m = make(dtype=torch.bfloat16, device="cuda")
    m.load_state_dict(base.state_dict())
    u = make(dtype=torch.bfloat16, device="cuda")
    u.load_state_dict(base.state_dict())
    xb = x64.to("cuda", torch.bfloat16)
    o_c, g_c = _run(m, xb, _extra(name, 1000, "cuda", torch.bfloat16, 4), _coda_forward)
    o_u, g_u = _run(u, xb, _extra(name, 1000, "cuda", torch.bfloat16, 4), _plain_forward)
    o_r, g_r = _run(base, x64, _extra(name, 1000, "cpu", torch.float64, 4), _plain_forward)
    for i, (a, b, c) in enumerate(zip(o_c, o_u, o_r)):
        accept(f"{name} out{i}", a, b, c)
    for n in g_r:
        accept(f"{name}.{n}", g_c[n], g_u[n], g_r[n], row_sum=True)  # a parameter's gradient sums over tokens


@requires_gpu
def test_gpu_models_llama_matches_hf():
    """coda.models.llama in bf16 (fp32 masters -> bf16 compute) vs HF bf16 vs HF float64, same weights."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=4096, hidden_size=512, intermediate_size=1536, num_hidden_layers=3,
                                   num_attention_heads=8, num_key_value_heads=4, head_dim=64, rms_norm_eps=1e-5,
                                   rope_theta=500000.0, tie_word_embeddings=True)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    ids = torch.randint(0, 4096, (4, 128))
    ref = hf.double()(input_ids=ids, labels=ids, use_cache=False).loss
    hf_b = transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16)
    hf_b.load_state_dict(hf.state_dict())
    unf = hf_b(input_ids=ids.cuda(), labels=ids.cuda(), use_cache=False).loss
    cm = coda.models.llama.LlamaForCausalLM(coda.models.llama.LlamaConfig.from_hf(cfg), dtype=torch.bfloat16,
                                            device="cuda")
    cm.load_state_dict(hf.state_dict())
    loss = cm(ids.cuda(), labels=ids.cuda()).loss
    accept("loss", loss, unf, ref)
