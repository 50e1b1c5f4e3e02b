"""A Hugging Face model as a workload: the native contract built from a transformers config.

The model is built from the config with random weights (step time and FLOPs do not depend on
them), or loaded with its weights (``#weights``, `--weights`) where the user wants the accuracy
guardrail on real numbers. The step is the model's own: the training step passes ``labels`` and
takes ``output.loss`` (causal LM: the input ids, shifted inside the model; masked LM: 15% of the
positions; sequence-to-sequence: a target sequence; classification: one label a sequence), the
inference step (``#inference``) the forward pass alone. Tokens are drawn inside the vocabulary.

Model FLOPs use the declared shape: the config's layers, attention heads and head dimension go
to the 6N + 12LHQT formula (`TRANSFORMER`), N from the built model's matmul weights; the stacked
expert weights of a mixture of experts are marked with the experts a token uses
(``num_experts_per_tok`` of ``num_experts``), so N counts the active share as the FLOP counter
sees it (`metrics.flops.matmul_parameters`).
"""

from __future__ import annotations

import copy
import types
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.model.decoders.hf_decoder import max_positions
from tpu_tuner.model.workloads.hf_source import HfSource, load_config, parse

if TYPE_CHECKING:
    from transformers import PretrainedConfig

DEFAULT_BATCH_SIZE = 4
DEFAULT_SEQ_LEN = 512
MASKED_SHARE = 0.15  # BERT's share of masked positions
# The auto class of each task, first match wins where the config declares no head.
_AUTO_CLASSES = {
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "seq2seq": "AutoModelForSeq2SeqLM",
    "classification": "AutoModelForSequenceClassification",
}
# Architecture-name endings -> task, for configs that name their head (config.json's "architectures").
_HEAD_SUFFIXES = (
    ("ForCausalLM", "causal-lm"),
    ("LMHeadModel", "causal-lm"),
    ("ForMaskedLM", "masked-lm"),
    ("ForConditionalGeneration", "seq2seq"),
    ("ForSeq2SeqLM", "seq2seq"),
    ("ForSequenceClassification", "classification"),
)


def hf_module(path: str) -> types.ModuleType:
    """A module with the native contract (build_model, make_batch, loss for training,
    BATCH_SIZE, SEQ_LEN, TRANSFORMER, NAME) for the ``hf:`` source `path`; the loader reads it as
    it reads a user's file. ``HF_CONFIG`` and ``HF_TASK`` say what it was built from."""
    source = parse(path)
    config = load_config(source)
    task = resolve_task(config, source)
    if task == "classification":
        prepare_classification(config)
    if task == "seq2seq" and getattr(config, "decoder_start_token_id", None) is None:
        # The decoder's inputs are the labels shifted right behind this id (T5 uses the pad id).
        config.decoder_start_token_id = getattr(config, "pad_token_id", None) or 0
    auto_class = _auto_class(task, config, source)
    vocab = _vocab(config, source)
    pad = getattr(config, "pad_token_id", None)
    if isinstance(pad, int) and pad >= vocab:
        # A vocabulary shrunk by an override leaves the published padding id outside it (Phi-3:
        # 32000), which the embedding refuses as its padding index.
        config.pad_token_id = None
    dropped = switch_off_dropout(config)
    # A step is one forward pass (and a backward): no KV cache kept for a next token. A cache
    # object is no output the accuracy guardrail can compare (on one device or gathered from ranks,
    # whose caches would hold their own heads), and a layer updating it guards on its own index,
    # so compiling each block apart (compile_scope = blocks) would recompile per layer.
    for part in (config, config.get_text_config() if hasattr(config, "get_text_config") else config):
        if hasattr(part, "use_cache"):
            part.use_cache = False
    module = types.ModuleType(f"tpu_tune_hf_{source.name}")

    def build_model() -> nn.Module:
        # A copy a build: a knob that switches a built model (set_attn_implementation) writes
        # into its config, which must not reach the next trial's model.
        return build(source, copy.deepcopy(config), auto_class)

    def make_batch(batch_size: int, seq_len: int | None) -> Any:
        inputs = synthetic_inputs(config, task, batch_size, seq_len or DEFAULT_SEQ_LEN, vocab)
        if source.inference:
            inputs.pop("labels", None)
            return inputs
        return inputs, inputs["labels"]

    def loss(output: Any, target: torch.Tensor) -> torch.Tensor:
        return output.loss  # the model's own loss of the labels in its inputs

    # A module built at run time: its attributes are set through its namespace.
    attributes: dict[str, Any] = {"build_model": build_model, "make_batch": make_batch}
    if not source.inference:
        attributes["loss"] = loss
    attributes["BATCH_SIZE"] = DEFAULT_BATCH_SIZE
    attributes["SEQ_LEN"] = min(DEFAULT_SEQ_LEN, max_positions(config, "max_seq_len") or DEFAULT_SEQ_LEN)
    dims = declared_dims(config)
    if dims is not None and not getattr(config, "is_encoder_decoder", False):
        # An encoder-decoder's step (two stacks, cross-attention) is not the decoder formula's:
        # its model FLOPs are the counted ones.
        causal = not _auto_knows(_AUTO_CLASSES["masked-lm"], config)
        attributes["TRANSFORMER"] = {**dims, "causal": causal}
    attributes["NAME"] = source.name
    attributes["NOTES"] = [f"dropout off for the accuracy guardrail ({', '.join(dropped)})"] if dropped else []
    attributes["HF_CONFIG"], attributes["HF_TASK"] = config, task
    vars(module).update(attributes)
    return module


def check_source(path: str) -> str:
    """Read the config, the task and its head for the ``hf:`` source `path` without building the
    model (what a command checks before it makes a run folder); the task, or `UserInputError`."""
    source = parse(path)
    config = load_config(source)
    task = resolve_task(config, source)
    _auto_class(task, config, source)
    _vocab(config, source)
    if source.weights and source.kind == "type":
        raise UserInputError("--weights needs a folder or a hub id with a checkpoint, not a model type", source.text)
    return task


def resolve_task(config: PretrainedConfig, source: HfSource) -> str:
    """The task the step runs: the one asked (``task=``), else the head the config's
    ``architectures`` name, else the first task whose auto class knows the config."""
    if source.task is not None:
        return source.task
    for architecture in getattr(config, "architectures", None) or ():
        for suffix, task in _HEAD_SUFFIXES:
            if architecture.endswith(suffix):
                return task
    # Encoder-decoders default to their sequence-to-sequence head, encoders (BERT, which also
    # has a causal head) to masked LM, decoders to causal LM.
    order = ("seq2seq",) if getattr(config, "is_encoder_decoder", False) else ("masked-lm", "causal-lm")
    for task in order + tuple(t for t in _AUTO_CLASSES if t not in order):
        if _auto_knows(_AUTO_CLASSES[task], config):
            return task
    raise UserInputError(
        f"the {config.model_type} config declares no head tpu-tune can run "
        f"(architectures: {', '.join(getattr(config, 'architectures', None) or ['none'])}; "
        f"heads: {', '.join(_AUTO_CLASSES)})",
        source.text,
    )


def _auto_knows(class_name: str, config: PretrainedConfig) -> bool:
    import transformers

    return type(config) in getattr(transformers, class_name)._model_mapping


def _auto_class(task: str, config: PretrainedConfig, source: HfSource) -> Any:
    import transformers

    class_name = _AUTO_CLASSES[task]
    if not _auto_knows(class_name, config):
        raise UserInputError(
            f"a {config.model_type} config has no {task} head in transformers {transformers.__version__}", source.text
        )
    return getattr(transformers, class_name)


def build(source: HfSource, config: PretrainedConfig, auto_class: Any) -> nn.Module:
    """The model: from the config with random weights, or from the checkpoint (``weights``)."""
    if source.weights:
        if source.kind == "type":
            raise UserInputError(
                "--weights needs a folder or a hub id with a checkpoint, not a model type", source.text
            )
        try:
            model = auto_class.from_pretrained(
                source.location, config=config, dtype=torch.float32, local_files_only=source.kind == "directory"
            )
        except Exception as exc:
            raise UserInputError(
                f"cannot load the weights of {source.location}: "
                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}",
                source.text,
            ) from exc
    else:
        model = auto_class.from_config(config, dtype=torch.float32)
    mark_active_experts(model, config)
    return model


def switch_off_dropout(config: PretrainedConfig) -> list[str]:
    """Set the config's dropout probabilities to 0 and say which were not. The accuracy guardrail
    compares a trial's loss and gradients with the reference step's; random dropout masks (drawn
    differently by eager and compiled code) would make every trial differ. Dropout is a few
    elementwise ops a layer; most current LLM configs have it at 0 already."""
    dropped = []
    for key, value in config.to_dict().items():
        if (
            (key.endswith("dropout") or key.endswith("pdrop") or key.endswith("dropout_prob"))
            and isinstance(value, float)
            and value > 0
        ):
            setattr(config, key, 0.0)
            dropped.append(f"{key} {value:g}")
    return dropped


def mark_active_experts(model: nn.Module, config: PretrainedConfig) -> None:
    """Mark each stacked-experts module with the experts a token uses (`n_experts`, `top_k`: the
    attributes `matmul_parameters` reads), from the config's ``num_experts_per_tok``."""
    top_k = getattr(config, "num_experts_per_tok", None)
    if not isinstance(top_k, int):
        return
    for module in model.modules():
        experts = getattr(module, "num_experts", None)
        if isinstance(experts, int) and any(p.dim() == 3 for p in module.parameters(recurse=False)):
            module.n_experts, module.top_k = experts, top_k  # type: ignore[assignment]  # Module.__setattr__ is typed for tensors and modules only


def synthetic_inputs(
    config: PretrainedConfig, task: str, batch_size: int, seq_len: int, vocab: int
) -> dict[str, torch.Tensor]:
    """Random tokens inside the vocabulary, with the labels the task's loss reads."""
    # A classification head on a decoder finds each sequence's last token by its padding id:
    # keep that id out of the tokens so every sequence is read whole.
    pad = getattr(config, "pad_token_id", None)
    high = vocab - 1 if task == "classification" and pad == vocab - 1 else vocab
    ids = torch.randint(0, high, (batch_size, seq_len))
    if task == "causal-lm":
        return {"input_ids": ids, "labels": ids}
    if task == "masked-lm":
        masked = torch.rand(batch_size, seq_len) < MASKED_SHARE
        masked[:, 0] = True  # at least one position a sequence, so the loss is defined
        mask_id = getattr(config, "mask_token_id", None)
        inputs = ids.masked_fill(masked, mask_id) if isinstance(mask_id, int) else ids
        return {"input_ids": inputs, "labels": ids.masked_fill(~masked, -100)}
    if task == "seq2seq":
        return {"input_ids": ids, "labels": torch.randint(0, vocab, (batch_size, seq_len))}
    return {"input_ids": ids, "labels": torch.randint(0, int(getattr(config, "num_labels", 2)), (batch_size,))}


def prepare_classification(config: PretrainedConfig) -> None:
    """A decoder's classification head needs a padding id to find the last token (for batches
    over 1): take the vocabulary's last id where the config has none."""
    if getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = _vocab_size(config) - 1


def _vocab(config: PretrainedConfig, source: HfSource) -> int:
    vocab = _vocab_size(config)
    if vocab <= 1:
        raise UserInputError(f"the {config.model_type} config has no vocabulary size", source.text)
    return vocab


def _vocab_size(config: PretrainedConfig) -> int:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(getattr(text, "vocab_size", 0) or 0)


def declared_dims(config: PretrainedConfig) -> dict[str, int] | None:
    """The attention shape the config declares: layers, query heads and head dimension (a
    ``head_dim`` of its own where it has one, as Gemma and Qwen3 do; else width / heads; latent
    attention's query/key and value head widths)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = getattr(text, "num_hidden_layers", None)
    heads = getattr(text, "num_attention_heads", None)
    width = getattr(text, "hidden_size", None)
    if (
        not (isinstance(layers, int) and isinstance(heads, int) and isinstance(width, int))
        or min(layers, heads, width) <= 0
    ):
        return None
    if getattr(text, "kv_lora_rank", None) and getattr(text, "v_head_dim", None):
        # Latent attention (DeepSeek): query/key heads of nope + rope dimensions, value heads their own.
        return {
            "layers": layers,
            "heads": heads,
            "head_dim": text.qk_nope_head_dim + text.qk_rope_head_dim,
            "value_head_dim": text.v_head_dim,
        }
    head_dim = getattr(text, "head_dim", None)
    if not isinstance(head_dim, int) or head_dim <= 0:
        head_dim = width // heads
    return {"layers": layers, "heads": heads, "head_dim": head_dim}


__all__ = [
    "build",
    "check_source",
    "declared_dims",
    "hf_module",
    "mark_active_experts",
    "prepare_classification",
    "resolve_task",
    "synthetic_inputs",
]
