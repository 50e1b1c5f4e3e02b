"""A Hugging Face decoder's config as the generic decoder's shape: what `tpu-tune plan hf:...` plans.

Each mapped family is read from its config the way its transformers modeling file builds the
model, so that the generic decoder (model/decoders/decoder.py) has the same parameters: tests build both
from tiny configs and require equal counts (tests/test_hf_decoder.py), and the planner checks the
count again for the config at hand (planner/plans/hf_plan.py). The families, what each adds to the
Llama baseline, and what is left out because it changes neither parameters nor matmul FLOPs:
docs/planner.md, "Planning a Hugging Face model". Sliding windows and chunks are read by
model/decoders/attention_pattern.py (an irregular pattern is not expressible). A config the decoder cannot
express raises `NotExpressible`, whose message names what is missing (one line).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tpu_tuner.core.errors import WorkloadError
from tpu_tuner.model.decoders.attention_pattern import read_attention
from tpu_tuner.model.decoders.decoder_shape import DecoderShape

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# transformers' activation names (ACT2FN) -> the decoder's: the tanh approximations are one.
_ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu": "relu",
}


class NotExpressible(ValueError):
    """The config has something the generic decoder cannot express; the message names it."""


def _activation(name: Any) -> str:
    if name not in _ACTIVATIONS:
        raise NotExpressible(f"the {name!r} activation is not expressible (known: {', '.join(_ACTIVATIONS)})")
    return _ACTIVATIONS[name]


def _rope(config: PretrainedConfig) -> tuple[float, float]:
    """(rope theta, share of each head rotated) from transformers 5's ``rope_parameters`` (one per
    attention kind in Gemma 3: the full-attention layers'), else the older top-level keys."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if params and all(isinstance(v, dict) for v in params.values()):
        params = params.get("full_attention") or next(iter(params.values()))
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    fraction = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    return float(theta), float(fraction)


def _attention(config: PretrainedConfig) -> dict[str, Any]:
    """The attention shape every family reads the same way."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return {
        "vocab": config.vocab_size,
        "d_model": config.hidden_size,
        "layers": config.num_hidden_layers,
        "heads": heads,
        "kv_heads": getattr(config, "num_key_value_heads", None) or heads,
        "head_dim": head_dim,
        "tied_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
    }


def attention_pattern(config: PretrainedConfig) -> dict[str, Any]:
    """The decoder's shape keys of the config's attention, as model/decoders/attention_pattern.py reads it:
    none where every layer is global; every layer local, or every N-th layer global; another
    pattern (windows of different sizes, global layers not every N-th) is not expressible."""
    try:
        window, chunk, every = read_attention(config).periodic()
    except ValueError as exc:
        raise NotExpressible(f"{exc}: not expressible") from exc
    keys = {"sliding_window": window} if window else {"attention_chunk": chunk} if chunk else {}
    return {**keys, "global_every": every} if keys and every else keys


def _llama_like(config: PretrainedConfig, activation: str = "hidden_act", **extra: Any) -> dict[str, Any]:
    """Llama's reading (rotary, RMSNorm, gated MLP, a sliding window where the config has one);
    `extra` sets what a family adds."""
    theta, fraction = _rope(config)
    bias = bool(getattr(config, "attention_bias", False))
    shape = {
        **_attention(config),
        **attention_pattern(config),
        "mlp": config.intermediate_size,
        "activation": _activation(getattr(config, activation)),
        "max_seq_len": config.max_position_embeddings,
        "norm_eps": config.rms_norm_eps,
        "rope_theta": theta,
        "rotary_fraction": fraction,
        "qkv_bias": bias,
        "out_bias": bias,
        "mlp_bias": bool(getattr(config, "mlp_bias", False)),
    }
    return {**shape, **extra}


def _gpt2(config: PretrainedConfig) -> dict[str, Any]:
    if getattr(config, "add_cross_attention", False):
        raise NotExpressible("cross-attention (add_cross_attention) is not expressible")
    return {
        "vocab": config.vocab_size,
        "d_model": config.n_embd,
        "layers": config.n_layer,
        "heads": config.n_head,
        "mlp": config.n_inner or 4 * config.n_embd,
        "gated": False,
        "activation": _activation(config.activation_function),
        "norm": "layer",
        "positions": "learned",
        "tied_embeddings": bool(config.tie_word_embeddings),
        "max_seq_len": config.n_positions,
        "norm_eps": config.layer_norm_epsilon,
        "qkv_bias": True,
        "out_bias": True,
        "mlp_bias": True,
    }


def _gpt_neox(config: PretrainedConfig) -> dict[str, Any]:
    theta, fraction = _rope(config)
    bias = bool(config.attention_bias)
    return {
        **_attention(config),
        "kv_heads": None,
        "head_dim": None,
        "mlp": config.intermediate_size,
        "gated": False,
        "activation": _activation(config.hidden_act),
        "norm": "layer",
        "max_seq_len": config.max_position_embeddings,
        "norm_eps": config.layer_norm_eps,
        "rope_theta": theta,
        "rotary_fraction": fraction,
        "qkv_bias": bias,
        "out_bias": bias,
        "mlp_bias": True,
        "parallel_residual": bool(config.use_parallel_residual),
    }


def _dense_layers(config: PretrainedConfig, experts: int) -> tuple[int, ...]:
    """The layers whose MLP is dense, as Qwen2-MoE's decoder layer decides it."""
    step, only = getattr(config, "decoder_sparse_step", 1) or 1, set(getattr(config, "mlp_only_layers", None) or ())
    return tuple(i for i in range(config.num_hidden_layers) if i in only or not (experts > 0 and (i + 1) % step == 0))


def _qwen_moe(config: PretrainedConfig, shared: bool, **extra: Any) -> dict[str, Any]:
    experts = config.num_experts
    dense = _dense_layers(config, experts)
    if len(dense) == config.num_hidden_layers:
        return _llama_like(config, **extra)
    return _llama_like(
        config,
        experts=experts,
        top_k=config.num_experts_per_tok,
        expert_mlp=config.moe_intermediate_size,
        shared_expert_mlp=config.shared_expert_intermediate_size if shared else 0,
        dense_layers=dense,
        **extra,
    )


def _llama4(config: PretrainedConfig) -> dict[str, Any]:
    """Llama 4's text model: routed experts (sigmoid of the top logit) with one shared expert in the
    layers ``moe_layers`` names, dense MLPs of ``intermediate_size_mlp`` elsewhere; chunked
    attention on the layers with rotary positions, global attention without them (NoPE)."""
    layers = config.num_hidden_layers
    step = config.interleave_moe_layer_step
    moe = set(getattr(config, "moe_layers", None) or range(step - 1, layers, step))
    every = attention_pattern(config).get("global_every", 0)
    pattern: dict[str, Any] = {}
    if every:  # the global layers turn no positions: they must be the NoPE layers
        nope = [i for i, rope in enumerate(config.no_rope_layers) if not rope]
        if nope != list(range(every - 1, layers, every)):
            raise NotExpressible(f"the NoPE layers {nope} are not every {every}-th layer: not expressible")
        pattern = {"global_rope": False}
    return _llama_like(
        config,
        mlp=config.intermediate_size_mlp,
        experts=config.num_local_experts,
        top_k=config.num_experts_per_tok,
        expert_mlp=config.intermediate_size,
        shared_experts=1,
        dense_layers=tuple(i for i in range(layers) if i not in moe),
        moe_routing="dropless",
        router="topk_sigmoid",
        **pattern,
    )


def _gpt_oss(config: PretrainedConfig) -> dict[str, Any]:
    """gpt-oss (transformers' modeling_gpt_oss.py): every layer's MLP is routed experts, the top
    ``num_experts_per_tok`` logits softmaxed, their fused gate_up projection ([experts, d, 2 x width],
    gate and up interleaved) the same parameters as separate gate and up ones; biases on the
    router, the experts and every attention projection (``attention_bias``); a learned sink per
    head in every layer; yarn rope scaling changes no matmul and is left out."""
    shape = _llama_like(
        config,
        experts=config.num_local_experts,
        top_k=config.num_experts_per_tok,
        moe_routing="dropless",
        router_bias=True,
        expert_bias=True,
        attention_sinks=True,
        swiglu_alpha=float(config.swiglu_alpha),
        swiglu_limit=float(config.swiglu_limit),
    )
    return {**shape, "activation": "clamped_swiglu"}  # the config's hidden_act ("silu") names no gate of its own


def _deepseek_v3(config: PretrainedConfig) -> dict[str, Any]:
    """DeepSeek-V3: multi-head latent attention, ``first_k_dense_replace`` dense layers, then routed
    experts (sigmoid scores, renormalised, times ``routed_scaling_factor``) beside shared ones.
    Group-limited routing (``n_group``, ``topk_group``) masks scores only: no matmul changes."""
    theta, _ = _rope(config)
    bias = bool(getattr(config, "attention_bias", False))
    return {
        **_attention(config),
        "kv_heads": None,
        "head_dim": None,
        "mlp": config.intermediate_size,
        "activation": _activation(config.hidden_act),
        "max_seq_len": config.max_position_embeddings,
        "norm_eps": config.rms_norm_eps,
        "rope_theta": theta,
        "qkv_bias": bias,
        "out_bias": bias,
        "experts": config.n_routed_experts,
        "top_k": config.num_experts_per_tok,
        "expert_mlp": config.moe_intermediate_size,
        "shared_experts": config.n_shared_experts or 0,
        "dense_layers": tuple(range(min(config.first_k_dense_replace or 0, config.num_hidden_layers))),
        "moe_routing": "dropless",
        "router": "sigmoid",
        "norm_topk_prob": bool(config.norm_topk_prob),
        "routed_scaling_factor": float(config.routed_scaling_factor),
        "q_lora_rank": config.q_lora_rank or 0,
        "kv_lora_rank": config.kv_lora_rank,
        "qk_nope_head_dim": config.qk_nope_head_dim,
        "qk_rope_head_dim": config.qk_rope_head_dim,
        "v_head_dim": config.v_head_dim,
    }


def _gemma4(config: PretrainedConfig) -> dict[str, Any]:
    """Gemma 4's text model (transformers' modeling_gemma4.py): Gemma 3's reading, the global
    layers' own head width (and, with attention_k_eq_v, KV heads and one K=V projection), and the
    small models' KV-shared layers, per-layer inputs and double-wide MLP (model/decoders/shape_checks.py)."""
    if getattr(config, "enable_moe_block", False):
        raise NotExpressible("Gemma 4's MoE block (a dense MLP beside the experts) is not expressible")
    # transformers refuses a per-layer key (head_dim, num_key_value_heads) read off the whole config
    # unless told: the base values are the local layers', the global layers' come from per_layer_config.
    config = copy.deepcopy(config)
    config.allow_global_per_layer_attribute_access = True
    full = [i for i, kind in enumerate(config.layer_types) if kind == "full_attention"]
    per_layer = config.per_layer_config[full[0]] if full else None
    per_layer_input = getattr(config, "hidden_size_per_layer_input", 0) or 0
    extra: dict[str, Any] = {
        "kv_shared_layers": config.num_kv_shared_layers,
        "per_layer_input": per_layer_input,
        "per_layer_vocab": config.vocab_size_per_layer_input if per_layer_input else 0,
        "double_wide_mlp": bool(config.use_double_wide_mlp and config.num_kv_shared_layers),
    }
    pattern = attention_pattern(config)
    if per_layer is not None and pattern:
        extra["global_head_dim"] = per_layer.head_dim
        if config.attention_k_eq_v:
            extra |= {"global_shared_kv": True, "global_kv_heads": per_layer.num_key_value_heads}
    return _llama_like(config, activation="hidden_activation", post_norms=True, qk_norm=True, **extra)


# model_type -> the decoder's shape keys, read from a config of that type.
FAMILIES: dict[str, Callable[[Any], dict[str, Any]]] = {
    "llama": _llama_like,
    "mistral": _llama_like,
    "qwen2": lambda c: _llama_like(c, qkv_bias=True, out_bias=False),
    "qwen3": lambda c: _llama_like(c, qk_norm=True),
    "gemma": _llama_like,
    "gemma2": lambda c: _llama_like(c, activation="hidden_activation", post_norms=True),
    "gemma3_text": lambda c: _llama_like(c, activation="hidden_activation", post_norms=True, qk_norm=True),
    "gemma4_text": _gemma4,
    "phi3": _llama_like,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "mixtral": lambda c: _llama_like(c, experts=c.num_local_experts, top_k=c.num_experts_per_tok),
    "qwen2_moe": lambda c: _qwen_moe(c, shared=True, qkv_bias=bool(c.qkv_bias), out_bias=False),
    "qwen3_moe": lambda c: _qwen_moe(
        c,
        shared=False,
        qk_norm=True,
        moe_routing="dropless",
        router="softmax_topk",
        norm_topk_prob=bool(c.norm_topk_prob),
    ),
    "llama4_text": _llama4,
    "deepseek_v3": _deepseek_v3,
    "gpt_oss": _gpt_oss,
}


def not_expressible(config: PretrainedConfig) -> str | None:
    """What a config has that no family's reading can express, in a line (None: nothing known)."""
    if (
        getattr(config, "kv_lora_rank", None) or getattr(config, "q_lora_rank", None)
    ) and config.model_type != "deepseek_v3":
        return (
            f"multi-head latent attention in a {config.model_type} config is not expressible (the decoder reads "
            "deepseek_v3's)"
        )
    if getattr(config, "is_encoder_decoder", False):
        return "an encoder-decoder is not expressible: the generic decoder is decoder-only"
    return None


def decoder_shape(config: PretrainedConfig) -> DecoderShape:
    """The generic decoder's shape for `config`; `NotExpressible` (one line, naming what is
    missing) for a family that is not mapped or a config the decoder cannot express."""
    lacking = not_expressible(config)
    if lacking:
        raise NotExpressible(lacking)
    read = FAMILIES.get(config.model_type)
    if read is None:
        raise NotExpressible(
            f"the generic decoder does not map {config.model_type!r} configs (it maps {', '.join(FAMILIES)})"
        )
    try:
        shape = DecoderShape(**read(config))
        shape.check(config.model_type)
    except (AttributeError, TypeError, ZeroDivisionError) as exc:  # qwen2?num_attention_heads=0: no heads
        raise NotExpressible(f"a {config.model_type} config without what its family needs: {exc}") from exc
    except WorkloadError as exc:
        raise NotExpressible(str(exc)) from exc
    return shape


def max_positions(config: PretrainedConfig, *also: str) -> int | None:
    """The longest sequence the config declares (``max_position_embeddings`` or GPT-2's ``n_positions``,
    then the keys `also` names)."""
    for key in ("max_position_embeddings", "n_positions", *also):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


__all__ = ["FAMILIES", "NotExpressible", "attention_pattern", "decoder_shape", "max_positions", "not_expressible"]
