"""Hugging Face transformers integration: coda.patch_llama(model) switches a LlamaForCausalLM to CODA kernels.

What changes: the model's forward (training and full-sequence inference) runs as CODA blocks:
  embeddings -> rmsnorm_prepare + rms_norm_qkv_rope (layer 0's q/k/v)
  for each layer: SDPA attention -> block (o-proj + residual + norm + SwiGLU MLP + residual + next layer's norm and
  q/k/v, one autograd node) ... the last layer ends in the final norm + LM head + loss (linear_cross_entropy: the
  logits are never materialised when labels are given).
What stays: the parameters (same tensors, HF layout: state_dict, save_pretrained, optimizers and tied embeddings
are untouched; the CODA layouts are built from them on each forward, a weight-sized gather whose gradient autograd
maps back), the config (rope scaling through the model's own inv_freq, rms_norm_eps, tie_word_embeddings), and
.generate(): decoding with a KV cache (cache / use_cache=True), output_attentions or output_hidden_states run HF's
original forward on the same weights.
"""
from __future__ import annotations

import types

import torch

from . import layout, ops
from .models.stack import LayerWeights, cast, causal_lm_head, compute_dtype, run_layers


def _unsupported(config):
    if getattr(config, "attention_bias", False):
        return "attention_bias=True (CODA's projections have no bias)"
    if getattr(config, "mlp_bias", False):
        return "mlp_bias=True (CODA's projections have no bias)"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act={config.hidden_act!r} (CODA's MLP is SwiGLU: silu)"
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim not in (64, 128):
        return f"head_dim={head_dim} (CODA's RoPE epilogue takes 64 or 128)"
    return None


def patch_llama(model):
    """Switches a transformers LlamaForCausalLM (or a model of the same structure) to CODA kernels, in place.

    Returns the model. Raises ValueError when the config has something CODA does not implement (biases, an
    activation other than silu, head_dim other than 64/128, a RoPE with attention scaling != 1); nothing is changed
    then. The CUDA path needs the model in bfloat16 or float16 on an sm_90 GPU; on the CPU the same code runs
    CODA's float64 reference. Calling it twice is harmless. coda.unpatch_llama(model) restores HF's forward.
    """
    if getattr(model, "_coda_original_forward", None) is not None:
        return model
    for attr in ("model", "lm_head", "config"):
        if not hasattr(model, attr):
            raise TypeError(f"coda.patch_llama: `model` must be a LlamaForCausalLM (no .{attr})")
    reason = _unsupported(model.config)
    if reason is not None:
        raise ValueError(f"coda.patch_llama: this model is not supported: {reason}")
    scaling = getattr(model.model.rotary_emb, "attention_scaling", 1.0)
    if scaling != 1.0:
        raise ValueError(f"coda.patch_llama: RoPE attention_scaling={scaling} is not supported (1.0 only; e.g. "
                         "'llama3' and 'linear' scaling are, 'yarn' is not)")
    model._coda_original_forward = model.forward
    model.forward = types.MethodType(_forward, model)
    return model


def unpatch_llama(model):
    """Undoes patch_llama (the parameters were never changed)."""
    original = getattr(model, "_coda_original_forward", None)
    if original is not None:
        model.forward = original
        model._coda_original_forward = None
    return model


def _forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
             labels=None, use_cache=None, logits_to_keep=0, **kwargs):
    from transformers.modeling_outputs import CausalLMOutputWithPast

    past = kwargs.pop("past_key_values", None)
    keep_old = kwargs.pop("num_logits_to_keep", None)  # transformers < 4.50's name of logits_to_keep
    if keep_old is not None and (not isinstance(logits_to_keep, int) or logits_to_keep == 0):
        logits_to_keep = keep_old
    wants_hf = (cache is not None or past is not None or use_cache is True or kwargs.get("output_attentions")
                or kwargs.get("output_hidden_states") or (attention_mask is not None and attention_mask.dim() != 2))
    if wants_hf:
        # Only what the caller gave: transformers 4.x names the cache past_key_values, 5.x accepts both.
        if past is not None:
            kwargs["past_key_values"] = past
        if cache is not None:
            kwargs["cache"] = cache
        return self._coda_original_forward(input_ids=input_ids, attention_mask=attention_mask,
                                           position_ids=position_ids, inputs_embeds=inputs_embeds, labels=labels,
                                           use_cache=use_cache, logits_to_keep=logits_to_keep, **kwargs)
    cfg, body = self.config, self.model
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // hq
    eps = cfg.rms_norm_eps
    x = body.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
    dt = compute_dtype(x)  # fp32 weights under torch.autocast: the kernels run in the autocast dtype
    x = cast(x, dt)
    B, S, _ = x.shape
    if position_ids is None:
        position_ids = torch.arange(S, device=x.device)[None, :]
    layers = [LayerWeights(*(cast(t, dt) for t in (
        layer.input_layernorm.weight,
        layout.qkv_weight(layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight, layer.self_attn.v_proj.weight,
                          hd),
        layer.self_attn.o_proj.weight, layer.post_attention_layernorm.weight,
        layout.interleave_gate_up(layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight), layer.mlp.down_proj.weight)))
              for layer in body.layers[: cfg.num_hidden_layers]]
    gamma_f = cast(body.norm.weight, dt)
    x, norm_cache = run_layers(x, position_ids.expand(B, S), body.rotary_emb.inv_freq.to(x.device), layers,
                               gamma_f, attention_mask, hq, hkv, hd, eps, cfg.attention_dropout if self.training else 0.0)
    loss, logits = causal_lm_head(x, norm_cache, gamma_f, cast(self.lm_head.weight, dt), eps, labels,
                                  kwargs.get("num_items_in_batch"), logits_to_keep)
    return_dict = kwargs.get("return_dict")
    if return_dict is None:
        return_dict = getattr(cfg, "return_dict", True)
    if not return_dict:
        return tuple(t for t in (loss, logits) if t is not None)
    return CausalLMOutputWithPast(loss=loss, logits=logits)
