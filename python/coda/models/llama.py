"""A LLaMA causal LM built from CODA blocks, with a Hugging Face state_dict.

    cfg = LlamaConfig.from_hf(transformers_config)          # or LlamaConfig(hidden_size=..., ...)
    model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16)
    model.load_state_dict(hf_model.state_dict())             # HF names and layouts, converted on load
    out = model(input_ids, labels=input_ids)                 # out.loss; out.logits when no labels

Parameters are held in CODA's layouts (W_qkv fused with q/k rows RoPE-paired, W_gu interleaved); state_dict() gives
HF names and layouts (q_proj/k_proj/v_proj, gate_proj/up_proj), so checkpoints go both ways unchanged. Attention is
torch.nn.functional.scaled_dot_product_attention (causal); every other op is a CODA kernel (coda.models.stack).

Two paths, the same math. Plain layers run fused across layer boundaries: one `block` op takes layer i's MLP and
layer i+1's norm and q/k/v. Layers that something wraps or hooks (torch.distributed.fsdp.fully_shard per layer,
checkpoint_wrapper, forward hooks) are called one by one instead (LlamaLayer.forward), each on its own weights only:
FSDP2 gathers a layer's weights around that call and frees them after, which a block reading the next layer's
weights would break. That path costs one rmsnorm_prepare per layer (a read of the activations).
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from typing import NamedTuple, Optional

import torch
from torch import nn

from .. import nn as cnn
from .. import ops
from .stack import LayerWeights, cast, causal_lm_head, layer_forward, run_layers, wrapped
from .stack import compute_dtype as stack_compute_dtype


@dataclasses.dataclass
class LlamaConfig:
    vocab_size: int = 32000
    hidden_size: int = 2048
    intermediate_size: int = 8192
    num_hidden_layers: int = 16
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: Optional[int] = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_scaling: Optional[dict] = None  # None, {"rope_type": "linear", "factor"} or {"rope_type": "llama3", ...}
    tie_word_embeddings: bool = True
    attention_dropout: float = 0.0
    initializer_range: float = 0.02

    def __post_init__(self):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads

    @classmethod
    def from_hf(cls, c):
        """From a transformers LlamaConfig (4.x rope_theta/rope_scaling or 5.x rope_parameters)."""
        rope = dict(getattr(c, "rope_parameters", None) or {})
        theta = rope.pop("rope_theta", getattr(c, "rope_theta", 10000.0))
        if not rope:
            rope = dict(getattr(c, "rope_scaling", None) or {})
        if rope.get("rope_type", rope.get("type", "default")) == "default":
            rope = None
        return cls(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                   num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                   num_key_value_heads=c.num_key_value_heads,
                   head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
                   rms_norm_eps=c.rms_norm_eps, rope_theta=theta, rope_scaling=rope,
                   tie_word_embeddings=c.tie_word_embeddings, attention_dropout=c.attention_dropout,
                   initializer_range=getattr(c, "initializer_range", 0.02))


def rope_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    """[head_dim/2] fp32 inverse frequencies: theta^(-2i/hd), with 'linear' or 'llama3' scaling."""
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    s = cfg.rope_scaling or {}
    kind = s.get("rope_type", s.get("type", "default"))
    if kind == "linear":
        inv = inv / s["factor"]
    elif kind == "llama3":
        factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old = s["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        smooth = ((old / wavelen - lo) / (hi - lo)).clamp(0.0, 1.0)
        # long wavelengths (> old/lo): divided by factor; short (< old/hi): kept; in between: interpolated.
        inv = (1 - smooth) * inv / factor + smooth * inv
    elif kind != "default":
        raise ValueError(f"coda.models.llama: rope_type {kind!r} is not supported (default, linear, llama3)")
    return inv.to(torch.float32)


class _Attention(nn.Module):
    def __init__(self, cfg, dtype, device):
        super().__init__()
        hq, hkv, hd, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        self.w_qkv = nn.Parameter(torch.empty(((hq + 2 * hkv) * hd, d), dtype=dtype, device=device))
        self.o_proj = nn.Linear(hq * hd, d, bias=False, dtype=dtype, device=device)
        cnn._hf_qkv_hooks(self, "w_qkv", hq, hkv, hd)


class _MLP(nn.Module):
    def __init__(self, cfg, dtype, device):
        super().__init__()
        self.w_gu = nn.Parameter(torch.empty((2 * cfg.intermediate_size, cfg.hidden_size), dtype=dtype,
                                             device=device))
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False, dtype=dtype, device=device)
        cnn._hf_gate_up_hooks(self, "w_gu")


# FSDP2 warns when a wrapped module returns a view, in case the caller modifies it in place (which would skip its
# pre-backward hook). A layer's output is the reshape of its last op's [tokens, d] result, and LlamaForCausalLM only
# passes it to the next op, never in place.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(FSDPLlamaLayer\) returned a view tensor")


class _RopeFrequencies:
    """inv_freq [hd/2] fp32, cached per device. Not a buffer: model.to(torch.bfloat16) would round the frequencies,
    and neither is it a forward argument: FSDP2's mixed precision casts floating inputs to the parameter dtype."""

    def __init__(self, cfg):
        self.cpu = rope_inv_freq(cfg)
        self.on = {}

    def __call__(self, device):
        if device not in self.on:
            self.on[device] = self.cpu.to(device)
        return self.on[device]


class LlamaLayer(nn.Module):
    """One decoder layer (HF names: input_layernorm, self_attn, post_attention_layernorm, mlp).
    forward(x [B, S, d], positions [B, S] int32, attention_mask=None, dropout=0.0) -> x_out [B, S, d], on this
    layer's weights only (the path for wrapped layers: see the module's docstring)."""

    def __init__(self, cfg, dtype=None, device=None, rope=None):
        super().__init__()
        self.input_layernorm = cnn._Norm(cfg.hidden_size, dtype, device)
        self.self_attn = _Attention(cfg, dtype, device)
        self.post_attention_layernorm = cnn._Norm(cfg.hidden_size, dtype, device)
        self.mlp = _MLP(cfg, dtype, device)
        self.heads = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.eps = cfg.rms_norm_eps
        self._rope = rope or _RopeFrequencies(cfg)

    def forward(self, x, positions, attention_mask=None, dropout=0.0):
        return layer_forward(x, positions, self._rope(x.device), self.weights(x.dtype), attention_mask, *self.heads,
                             self.eps, dropout)

    def weights(self, dtype) -> LayerWeights:
        c = lambda p: p if p.dtype == dtype else p.to(dtype)  # noqa: E731
        return LayerWeights(c(self.input_layernorm.weight), c(self.self_attn.w_qkv), c(self.self_attn.o_proj.weight),
                            c(self.post_attention_layernorm.weight), c(self.mlp.w_gu), c(self.mlp.down_proj.weight))


class LlamaModel(nn.Module):
    def __init__(self, cfg, dtype=None, device=None):
        super().__init__()
        self._rope = _RopeFrequencies(cfg)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype, device=device)
        self.layers = nn.ModuleList(LlamaLayer(cfg, dtype, device, self._rope) for _ in range(cfg.num_hidden_layers))
        self.norm = cnn._Norm(cfg.hidden_size, dtype, device)

    def inv_freq(self, device):
        return self._rope(device)

    def fused(self):
        """True when every layer is a plain LlamaLayer without forward hooks: then the layers run fused across
        their boundaries; otherwise each layer's (wrapped) forward is called."""
        return not wrapped(self.layers, LlamaLayer)


class CausalLMOutput(NamedTuple):
    loss: Optional[torch.Tensor]
    logits: Optional[torch.Tensor]


class LlamaForCausalLM(nn.Module):
    """LLaMA causal LM on CODA kernels. forward(input_ids [B, S], labels=None, position_ids=None,
    attention_mask=None, num_items_in_batch=None, logits_to_keep=0, compute_dtype=None) -> CausalLMOutput(loss,
    logits): with labels, the HF next-token loss (labels shifted inside, -100 ignored) and logits None; without,
    logits [B, S', V]. compute_dtype (e.g. torch.bfloat16 with fp32 parameters) casts activations and weights; by
    default it is torch.autocast's dtype when autocast is on and the parameters are fp32."""

    def __init__(self, cfg: LlamaConfig, dtype=None, device=None):
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg, dtype, device)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=dtype, device=device)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.reset_parameters()
        cnn._full_to_shard_hook(self)

    @torch.no_grad()
    def reset_parameters(self):
        """HF's initialisation: normal(0, initializer_range) weights, unit norms."""
        std = self.config.initializer_range
        for name, p in self.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.fill_(1.0)
            else:
                p.normal_(0.0, std)

    def forward(self, input_ids, labels=None, position_ids=None, attention_mask=None, num_items_in_batch=None,
                logits_to_keep=0, compute_dtype=None):
        cfg = self.config
        x = self.model.embed_tokens(input_ids)
        # e.g. fp32 master weights with bf16 compute (compute_dtype, or torch.autocast): weights are cast per forward
        x = cast(x, stack_compute_dtype(x, compute_dtype))
        B, S, _ = x.shape
        if position_ids is None:
            position_ids = torch.arange(S, device=x.device)[None, :]
        gamma_f = self.model.norm.weight.to(x.dtype)
        dropout = cfg.attention_dropout if self.training else 0.0
        if self.model.fused():
            layers = [layer.weights(x.dtype) for layer in self.model.layers]
            x, norm_cache = run_layers(x, position_ids.expand(B, S), self.model.inv_freq(x.device), layers, gamma_f,
                                       attention_mask, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                                       cfg.rms_norm_eps, dropout)
        else:
            positions = position_ids.expand(B, S).to(torch.int32).contiguous()
            for layer in self.model.layers:
                x = layer(x, positions, attention_mask, dropout)
            norm_cache = ops.rmsnorm_prepare(x, gamma_f, cfg.rms_norm_eps)
        loss, logits = causal_lm_head(x, norm_cache, gamma_f, self.lm_head.weight.to(x.dtype), cfg.rms_norm_eps,
                                      labels, num_items_in_batch, logits_to_keep)
        return CausalLMOutput(loss, logits)
