"""Hugging Face transformers integration: coda.patch_llama(model) switches a LlamaForCausalLM to CODA kernels,
coda.patch_qwen3(model) a (dense) Qwen3ForCausalLM.

What changes: the model's forward (training and full-sequence inference) runs as CODA blocks:
  embeddings -> rmsnorm_prepare + rmsnorm_qkv_rope (layer 0's q/k/v)
  for each layer: SDPA attention -> block (o-proj + residual + norm + SwiGLU MLP + residual + next layer's norm and
  q/k/v, one autograd node) ... the last layer ends in the final norm + LM head + loss (linear_cross_entropy: the
  logits are never materialised when labels are given). When the decoder layers are wrapped or hooked (FSDP2's
  fully_shard per layer, checkpoint_wrapper, hooks) or HF's gradient checkpointing is on, each layer is called
  through its module with CODA's per-layer forward instead (stack.layer_forward), so the wrappers act on it.
What stays: the parameters (same tensors, HF layout: state_dict, save_pretrained, optimizers and tied embeddings
are untouched; the CODA layouts are built from them on each forward, a weight-sized gather whose gradient autograd
maps back), the config (rope scaling through the model's own inv_freq, rms_norm_eps, tie_word_embeddings), and
.generate(): decoding with a KV cache (cache / use_cache=True), output_attentions or output_hidden_states run HF's
original forward on the same weights.
Qwen3 (QK-norm: a per-head RMSNorm of q and k before RoPE) runs the same way except for the attention input: each
layer's q/k/v come from ops.rmsnorm_qkv_qk_norm_rope (one GEMM with the input norm's row scale, the per-head norm
and RoPE fused in its epilogue), and the layers run through the cross-layer block as LLaMA's do, the block taking the
QK-norm (coda.models.stack.QK_NORM_BLOCK; CODA_QK_NORM_BLOCK=0 runs the layers one by one instead).
"""
from __future__ import annotations

import functools
import types
from contextlib import nullcontext
from typing import NamedTuple

import torch
import torch.utils.checkpoint

from . import layout, ops
from .models.stack import LayerWeights, cast, causal_lm_head, compute_dtype, layer_forward, run_layers, wrapped


def _unsupported(config):
    if getattr(config, "use_sliding_window", False) or "sliding_attention" in (getattr(config, "layer_types", None)
                                                                                or ()):
        return "sliding-window attention (CODA's layers run full causal attention)"
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
    activation other than silu, head_dim other than 64/128, a RoPE with attention scaling != 1, sliding-window
    attention) or the attention has a QK-norm (use patch_qwen3); nothing is changed then. The CUDA path needs the
    model in bfloat16 or float16 on an sm_90 GPU; on the CPU the same code runs CODA's float64 reference. Calling it
    twice is harmless. coda.unpatch_llama(model) restores HF's forward.
    """
    return _patch(model, "patch_llama", "LlamaForCausalLM", qk_norm=False)


def patch_qwen3(model):
    """Switches a transformers Qwen3ForCausalLM (dense; or a model of the same structure: LLaMA with a per-head
    RMSNorm of q and k before RoPE) to CODA kernels, in place, with patch_llama's guarantees: the same parameters
    (state_dict, save_pretrained, optimizers), .generate() on HF's forward, torch.compile, FSDP2 per layer,
    refusal of what CODA does not implement (as patch_llama, and a model without q_norm / k_norm: use patch_llama)
    with the reason, nothing changed then. coda.unpatch_qwen3(model) restores HF's forward.
    """
    return _patch(model, "patch_qwen3", "Qwen3ForCausalLM", qk_norm=True)


def _has_qk_norm(model):
    return any(hasattr(layer.self_attn, "q_norm") for layer in _decoder_layers(model))


def _patch(model, name, kind, qk_norm):
    if getattr(model, "_coda_original_forward", None) is not None:
        return model
    for attr in ("model", "lm_head", "config"):
        if not hasattr(model, attr):
            raise TypeError(f"coda.{name}: `model` must be a {kind} (no .{attr})")
    reason = _unsupported(model.config)
    if reason is None and not all(all(hasattr(layer.mlp, a) for a in ("gate_proj", "up_proj", "down_proj"))
                                  for layer in _decoder_layers(model)):
        reason = "its MLP is not one gate/up/down SwiGLU per layer (e.g. a mixture of experts)"
    if reason is None and _has_qk_norm(model) != qk_norm:
        reason = ("its attention normalises q and k per head (QK-norm): use coda.patch_qwen3" if not qk_norm else
                  "its attention has no q_norm / k_norm (no QK-norm): use coda.patch_llama")
    if reason is not None:
        raise ValueError(f"coda.{name}: this model is not supported: {reason}")
    scaling = getattr(model.model.rotary_emb, "attention_scaling", 1.0)
    if scaling != 1.0:
        raise ValueError(f"coda.{name}: RoPE attention_scaling={scaling} is not supported (1.0 only; e.g. "
                         "'llama3' and 'linear' scaling are, 'yarn' is not)")
    model._coda_original_forward = model.forward
    model.forward = types.MethodType(_forward, model)
    for layer in _decoder_layers(model):
        layer._coda_own_forward = layer.__dict__.get("forward")  # an instance forward set before the patch, if any
        layer._coda_inv_freq = functools.partial(_inv_freq, model.model.rotary_emb)
        layer.forward = types.MethodType(_layer_forward, layer)
    model._coda_layer_type = type(_decoder_layers(model)[0]) if len(model.model.layers) else None
    return model


def unpatch_llama(model):
    """Undoes patch_llama or patch_qwen3 (the parameters were never changed)."""
    original = getattr(model, "_coda_original_forward", None)
    if original is not None:
        model.forward = original
        model._coda_original_forward = None
        for layer in _decoder_layers(model):
            if "_coda_own_forward" in layer.__dict__:
                own = layer.__dict__.pop("_coda_own_forward")
                layer.__dict__.pop("_coda_inv_freq", None)
                if own is None:
                    layer.__dict__.pop("forward", None)
                else:
                    layer.forward = own
    return model


def _decoder_layers(model):
    """The decoder layers themselves (inside a checkpoint_wrapper when one was applied before the patch)."""
    return [getattr(layer, "_checkpoint_wrapped_module", layer)
            for layer in model.model.layers[: model.config.num_hidden_layers]]


class _LayerCall(NamedTuple):
    """CODA's per-layer arguments, passed to a decoder layer as one keyword. The RoPE frequencies are not among them:
    FSDP2's mixed precision casts floating inputs to bf16; each layer reads them from the model (_inv_freq)."""
    positions: torch.Tensor
    attention_mask: object
    heads: tuple
    eps: float
    dropout: float
    checkpoint: object  # None, or the model's checkpoint function (HF's gradient checkpointing, transformers < 4.52)


def _layer_forward(self, *args, _coda=None, **kwargs):
    """A decoder layer's forward after patch_llama: CODA's (stack.layer_forward) when the patched model calls it with
    `_coda`, HF's own otherwise (decoding with a KV cache). Called through the module, so FSDP2's gather and free and
    a checkpoint wrapper act on it; HF's gradient checkpointing flag is honoured here."""
    if _coda is None:  # through the class, so wrappers of the class's forward (HF's checkpointing) still apply
        own = self._coda_own_forward
        return own(*args, **kwargs) if own is not None else type(self).forward(self, *args, **kwargs)
    (x,) = args

    def run(x):
        hq, hkv, hd = _coda.heads
        inv_freq = self._coda_inv_freq(x.device)
        builds = _layout_builds(self, hd)
        w = _layer_weights(self, builds, x.dtype, hd)
        with _layout_copies_recomputed(w, builds, x.dtype) if not _saved_tensor_hooks_active() else nullcontext():
            return layer_forward(x, _coda.positions, inv_freq, w, _coda.attention_mask, hq, hkv, hd, _coda.eps,
                                 _coda.dropout)

    checkpoint = _coda.checkpoint
    if checkpoint is None and getattr(self, "gradient_checkpointing", False):  # transformers >= 4.52: per layer
        checkpoint = _checkpoint_function(self)
    if checkpoint is not None and self.training and torch.is_grad_enabled():
        return checkpoint(run, x)
    return run(x)


def _checkpoint_function(module):
    """HF's checkpoint function of a module with gradient checkpointing on (its gradient_checkpointing_kwargs,
    use_reentrant included), else torch's non-reentrant checkpoint."""
    fn = getattr(module, "_gradient_checkpointing_func", None)
    return fn if fn is not None else functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)


def _saved_tensor_hooks_active():
    """True inside someone else's saved-tensor hooks (non-reentrant checkpointing: torch.utils.checkpoint,
    checkpoint_wrapper, HF's gradient checkpointing; save_on_cpu) or while torch.compile traces. Only the innermost
    hooks act, so the recipe's would take over from them (a checkpoint would then keep every activation); they
    already keep no layout copy."""
    if torch.compiler.is_compiling():  # not traced: the compiled graph keeps what it keeps
        return True
    a = torch._C._autograd
    top = getattr(a, "_top_saved_tensors_default_hooks", None)
    enabled = getattr(a, "_saved_tensors_hooks_is_enabled", None)
    if top is None or enabled is None or not enabled():  # unknown torch, or hooks disabled (torch.func): none of ours
        return True
    return top(False) is not None


def _layout_copies_recomputed(w, builds, dt):
    """Saved-tensor hooks under which the ops keep, instead of the layer's W_qkv and W_gu in CODA's layouts (copies
    of HF's q/k/v and gate/up weights, made by `builds`), a recipe that rebuilds them in the backward. Under
    fully_shard per layer the copies would otherwise stay unsharded until the backward; FSDP2 gathers the HF weights
    again before the layer's backward runs, which is when the recipe reads them. Costs one more weight-sized copy in
    the backward."""
    copies = ((w.w_qkv, builds[0]), (w.w_gu, builds[1]))

    def pack(t):
        for copy, build in copies:
            if t is copy:
                return _Rebuild(build, dt)
        return t

    def unpack(packed):
        if isinstance(packed, _Rebuild):
            with torch.no_grad():
                return cast(packed.build(), packed.dtype)
        return packed

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


class _Rebuild(NamedTuple):
    build: object
    dtype: torch.dtype


def _inv_freq(rotary_emb, device):
    return rotary_emb.inv_freq.to(device)


def _layout_builds(layer, hd):
    """(W_qkv, W_gu) of one HF decoder layer in CODA's layouts, as two functions of the layer's weights now (the
    recipe of _layout_copies_recomputed calls them again in the backward)."""
    attn, mlp = layer.self_attn, layer.mlp
    q, k, v, g, u = attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, mlp.gate_proj.weight, mlp.up_proj.weight
    return (lambda: layout.qkv_weight(q, k, v, hd)), (lambda: layout.interleave_gate_up(g, u))


def _layer_weights(layer, builds, dt, hd):
    """One HF decoder layer's weights in CODA's layouts and the compute dtype (a weight-sized gather per forward,
    whose gradient autograd maps back to the HF parameters); with QK-norm also its q_norm / k_norm weights in the
    RoPE-paired order of W_qkv's q/k rows."""
    qkv, gu = builds
    attn = layer.self_attn
    norms = ()
    if hasattr(attn, "q_norm"):
        norms = tuple(layout.pair_rope_rows(n.weight, hd) for n in (attn.q_norm, attn.k_norm))
    return LayerWeights(*(cast(t, dt) for t in (
        layer.input_layernorm.weight, qkv(), attn.o_proj.weight, layer.post_attention_layernorm.weight,
        gu(), layer.mlp.down_proj.weight, *norms)))


def _per_layer(model, layers):
    """True when the decoder layers must run one by one (each on its own weights): something wraps or hooks them
    (torch.distributed.fsdp.fully_shard per layer, checkpoint_wrapper, forward hooks), or HF's gradient
    checkpointing is on. Otherwise run_layers fuses across layer boundaries."""
    return (getattr(model.model, "gradient_checkpointing", False) or wrapped(layers, model._coda_layer_type)
            or any(getattr(layer, "gradient_checkpointing", False) for layer in layers))


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
    gamma_f = cast(body.norm.weight, dt)
    dropout = cfg.attention_dropout if self.training else 0.0
    modules = body.layers[: cfg.num_hidden_layers]
    if _per_layer(self, modules):
        # transformers < 4.52 flags gradient checkpointing on the LlamaModel, later ones on each layer
        model_checkpoint = _checkpoint_function(body) if getattr(body, "gradient_checkpointing", False) else None
        call = _LayerCall(position_ids.expand(B, S).to(torch.int32).contiguous(), attention_mask, (hq, hkv, hd), eps,
                          dropout, model_checkpoint)
        for module in modules:
            x = module(x, _coda=call)
        norm_cache = ops.rmsnorm_prepare(x, gamma_f, eps)
    else:
        layers = [_layer_weights(layer, _layout_builds(layer, hd), dt, hd) for layer in modules]
        x, norm_cache = run_layers(x, position_ids.expand(B, S), body.rotary_emb.inv_freq.to(x.device), layers,
                                   gamma_f, attention_mask, hq, hkv, hd, eps, dropout)
    loss, logits = causal_lm_head(x, norm_cache, gamma_f, cast(self.lm_head.weight, dt), eps, labels,
                                  kwargs.get("num_items_in_batch"), logits_to_keep)
    return_dict = kwargs.get("return_dict")
    if return_dict is None:
        return_dict = getattr(cfg, "return_dict", True)
    if not return_dict:
        return tuple(t for t in (loss, logits) if t is not None)
    return CausalLMOutputWithPast(loss=loss, logits=logits)


unpatch_qwen3 = unpatch_llama
