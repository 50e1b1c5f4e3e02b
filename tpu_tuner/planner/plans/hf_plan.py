"""What the planner compiles for an ``hf:`` source (a Hugging Face config): `planned_workload`.

Three routes, decided from the config alone, so that the plan's process and every compiler
process (each loads the workload from the source text) take the same one:

1. **The generic decoder**, for the families model/decoders/hf_decoder.py maps (Llama, Mistral, Qwen2/3,
   Gemma 1-3, Phi-3, GPT-2, GPT-NeoX, Mixtral, Qwen2/3-MoE, Llama 4, DeepSeek-V3, gpt-oss), when
   its parameter count equals that of the transformers model built from the same config on the
   meta device (a fraction of a second, no memory): the program is then the one `tpu-tune plan shape.toml` compiles.
2. **The transformers module traced through torchax** otherwise (a family not mapped, or a
   config of a mapped one whose count differs): the causal LM itself, its attention routed to the
   planner's sharded flash attention (`step_parts.sharded_attention`) through an attention
   function registered with transformers, its logits what the step's cross-entropy reads.
3. **A one-line refusal** (`UserInputError` naming the source) where neither can: multi-head
   latent attention (the TPU flash kernel needs values as wide as keys), routed experts outside
   the mapped families (transformers loops over the experts a batch hits: data-dependent shapes
   the compiler cannot take), heterogeneous layers (the blocks compile as one scanned stack), a
   step other than a causal LM's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.model.decoders.attention_pattern import read_attention, warn_unread
from tpu_tuner.model.decoders.decoder import Decoder, decoder_module
from tpu_tuner.model.decoders.hf_decoder import NotExpressible, decoder_shape, max_positions, not_expressible
from tpu_tuner.model.decoders.transformer_dims import TransformerDims
from tpu_tuner.model.workloads.blocks import blocks_of
from tpu_tuner.model.workloads.hf_source import HfSource, is_hf_source, load_config, parse
from tpu_tuner.model.workloads.loader import load_workload
from tpu_tuner.model.workloads.workload import Workload

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# The sequence a plan compiles unless --seq says otherwise: the config's positions, at most
# 8192 (MaxText's published Llama and Mixtral runs, the calibration rows, train at 8192).
MAX_DEFAULT_SEQ = 8192
ModuleT = TypeVar("ModuleT", bound=nn.Module)
ATTENTION = "tpu_tune_planner"  # the attention implementation registered with transformers
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def planned_workload(source: str | Path) -> Workload:
    """The workload the planner compiles for `source`: a user's file or a decoder shape as the
    loader reads it; for an ``hf:`` source the generic decoder, or the traced transformers
    module, or a one-line `UserInputError` (see the module docstring)."""
    text = str(source)
    if not is_hf_source(text):
        return load_workload(source)
    hf = parse(text)
    config = load_config(hf)
    _check_causal_lm(config, hf)
    warn_unread(read_attention(config), config.model_type)  # on either route: never silently global
    name = hf.name
    try:
        shape = decoder_shape(config)
        ours = sum(p.numel() for p in _on_meta(lambda: Decoder(shape)).parameters())
        theirs = transformers_parameters(config)
        if ours != theirs:
            raise NotExpressible(
                f"the generic decoder's reading has {ours:,} parameters, transformers' model "
                f"{theirs:,}: the config sets something its family's mapping does not read"
            )
    except NotExpressible as exc:
        blocker = untraceable(config)
        if blocker:
            raise UserInputError(blocker, text) from exc
        return _traced(config, text, name, f"{hf.text}: traced through torchax ({exc})")
    seq = default_seq_len(config)
    module = decoder_module(shape, name, 1, seq)
    note = (
        f"{hf.text}: the {config.model_type} config as the generic decoder ({theirs:,} parameters, as "
        "transformers counts them)"
    )
    return _workload(
        module.build_model,
        module.make_batch,
        module.loss,
        seq,
        text,
        name,
        config,
        note,
        TransformerDims(**module.TRANSFORMER),
    )


def transformers_parameters(config: PretrainedConfig) -> int:
    """`num_parameters()` of transformers' causal LM built from `config` on the meta device."""
    import transformers

    try:
        return int(_on_meta(lambda: transformers.AutoModelForCausalLM.from_config(config)).num_parameters())
    except Exception as exc:
        lines = str(exc).strip().splitlines()
        raise UserInputError(
            f"transformers cannot build a {config.model_type} causal LM from this config: "
            f"{lines[0] if lines else type(exc).__name__}"
        ) from exc


def untraceable(config: PretrainedConfig) -> str | None:
    """Why the traced transformers module cannot be planned either (None: it can be tried)."""
    lacking = not_expressible(config)
    if lacking:
        return lacking
    experts = [key for key in _EXPERT_KEYS if isinstance(getattr(config, key, None), int) and getattr(config, key) > 0]
    if experts:
        return (
            f"routed experts ({experts[0]}) in the {config.model_type} config are not expressible: the generic "
            "decoder maps Mixtral's, Qwen2/3-MoE's, Llama 4's, DeepSeek-V3's and gpt-oss's, and transformers' "
            "expert loop has data-dependent shapes the TPU compiler cannot trace"
        )
    return None


def default_seq_len(config: PretrainedConfig) -> int:
    """The plan's sequence length where --seq is not given: the config's positions, at most 8192."""
    return min(max_positions(config) or MAX_DEFAULT_SEQ, MAX_DEFAULT_SEQ)


def source_digest(source: str) -> str | None:
    """sha256 of what an ``hf:`` source plans (the source and its config's values), for a
    search's study record; None for any other source (its file's bytes say it)."""
    if not is_hf_source(source):
        return None
    config = load_config(parse(source)).to_dict()
    return hashlib.sha256(json.dumps([source, config], sort_keys=True, default=str).encode()).hexdigest()


def check_seq_len(workload: Workload, seq_len: int) -> None:
    """Refuse a sequence longer than an ``hf:`` model's positions (learned positions have no more
    rows; a rotary model's config says it was trained no longer)."""
    limit = max_positions(workload.hf_config) if workload.hf_config is not None else None
    if limit is not None and seq_len > limit:
        raise UserInputError(
            f"--seq {seq_len} is longer than the model's {limit} positions (max_position_embeddings)", workload.source
        )


def _check_causal_lm(config: PretrainedConfig, hf: HfSource) -> None:
    from tpu_tuner.model.workloads.hf_workload import resolve_task

    if hf.inference:
        raise UserInputError("the planner plans training steps: drop #inference", hf.text)
    task = resolve_task(config, hf)
    if task != "causal-lm":
        raise UserInputError(
            f"the planner plans causal language models, and this {config.model_type} config's step is {task}", hf.text
        )


def _on_meta(build: Callable[[], ModuleT]) -> ModuleT:
    with torch.device("meta"):
        return build()


class TracedCausalLM(nn.Module):
    """transformers' causal LM as the planner's step reads a model: token ids in, logits out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=tokens, use_cache=False).logits


def planner_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface answered by scaled_dot_product_attention, causal and
    unmasked (a training batch of whole sequences), which the compiled program turns into the
    sharded flash kernel. Sliding windows and soft-capping are left out of the program (a cap adds
    no matmul); the model FLOPs still count a local layer by its window (`_traced`'s spans)."""
    import torch.nn.functional as F

    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        is_causal=getattr(module, "is_causal", True),
        scale=scaling,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


def _traced(config: PretrainedConfig, text: str, name: str, note: str) -> Workload:
    from tpu_tuner.model.workloads.hf_workload import declared_dims

    dims = declared_dims(config)
    if dims is None:
        raise UserInputError(f"a {config.model_type} config without layers, heads and width to plan", text)
    kv_heads = getattr(config, "num_key_value_heads", None) or dims["heads"]
    # The model FLOPs follow the config's pattern (local layers by their window or chunks), whatever
    # the traced program computes.
    spans = read_attention(config, dims["layers"]).spans(dims["heads"], dims["head_dim"])

    def build_model() -> nn.Module:
        import transformers

        transformers.AttentionInterface.register(ATTENTION, planner_attention)
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=ATTENTION)
        # The planner reads heads off the blocks (model/workloads/structure.py); transformers' attention
        # modules do not all carry them.
        for block in blocks_of(model)[1]:
            block.num_attention_heads, block.num_key_value_heads = dims["heads"], kv_heads  # type: ignore[assignment]  # Module.__setattr__ is typed for tensors and modules only
        return TracedCausalLM(model)

    def make_batch(batch_size: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, config.vocab_size, (batch_size, seq_len))
        return tokens, tokens

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(), targets[:, 1:].reshape(-1))

    return _workload(
        build_model,
        make_batch,
        loss,
        default_seq_len(config),
        text,
        name,
        config,
        note,
        TransformerDims(dims["layers"], dims["heads"], dims["head_dim"], True, spans),
    )


def _workload(
    build_model: Any,
    make_batch: Any,
    loss: Any,
    seq_len: int,
    text: str,
    name: str,
    config: PretrainedConfig,
    note: str,
    dims: TransformerDims,
) -> Workload:
    return Workload(
        name=name,
        source=Path(text),
        build_model=build_model,
        make_batch=make_batch,
        batch_size=1,
        seq_len=seq_len,
        convention="native",
        loss_fn=loss,
        transformer=dims,
        notes=[note],
        hf_config=config,
        hf_task="causal-lm",
    )


__all__ = [
    "ATTENTION",
    "MAX_DEFAULT_SEQ",
    "TracedCausalLM",
    "check_seq_len",
    "default_seq_len",
    "planned_workload",
    "planner_attention",
    "source_digest",
    "transformers_parameters",
    "untraceable",
]
