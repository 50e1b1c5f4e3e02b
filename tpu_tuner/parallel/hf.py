"""Layouts of a Hugging Face transformers model from what the model declares about itself.

A transformers `PreTrainedModel` says how it splits: its tensor-parallel plan (``model.tp_plan``:
the class's ``_tp_plan`` with the config's ``base_model_tp_plan``, e.g. Llama's q / k / v / gate /
up projections ``colwise``, o / down ``rowwise``, the token embedding ``embedding_rowwise``, the
output head ``colwise_gather_output``) and the blocks it must never split across devices
(``_no_split_modules``: the decoder layer classes). `parallel.apply.apply_layout` takes both from
here for such a model, whoever built it (an ``hf:`` workload in a trial, a user's
``from_pretrained`` model in their own script):

* tensor: the plan, expanded to the model's module and parameter names, applied by transformers'
  own ``apply_tensor_parallelism`` (DTensor parameters and the styles' forward hooks, as
  ``from_pretrained(tp_plan="auto")`` applies it) on the layout's tensor sub-mesh;
* fsdp: FSDP2 ``fully_shard`` on every ``_no_split_modules`` block (the outermost ones), then
  the root, as torchtitan shards its blocks.

transformers is imported only when a model is one of its own (it is then imported already), so
ordinary models never import it.
"""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING, Any

from tpu_tuner.parallel.errors import LayoutError

if TYPE_CHECKING:
    from torch import nn

# The config attributes holding the head counts a split of q / k / v must keep whole.
HEAD_COUNT_KEYS = ("num_attention_heads", "num_key_value_heads")
# Which dimension of a weight each style splits (a negative index counts from the last), and
# into how many packed parts each rank takes a share of (gate and up packed in one weight: 2).
_SPLIT_DIMS: dict[str, tuple[int, int]] = {
    "colwise": (-2, 1),
    "colwise_rep": (-2, 1),
    "colwise_gather_output": (-2, 1),
    "rowwise": (-1, 1),
    "rowwise_rep": (-1, 1),
    "rowwise_split_input": (-1, 1),
    "packed_colwise": (-2, 2),
    "packed_rowwise": (-1, 2),
    "embedding_rowwise": (0, 1),
    "embedding_colwise": (1, 1),
}


def is_hf_model(model: nn.Module) -> bool:
    """Whether `model` is a transformers `PreTrainedModel` (False without importing transformers:
    a model of its own means the package is imported already)."""
    transformers = sys.modules.get("transformers")
    if transformers is None:
        return False
    try:
        return isinstance(model, transformers.PreTrainedModel)
    except Exception:
        return False


def declared_plan(model: nn.Module) -> dict[str, str]:
    """The model's tensor-parallel plan as it declares it (pattern -> style, ``*`` for a layer
    number), {} where it has none."""
    plan = getattr(model, "tp_plan", None)
    if not isinstance(plan, dict) or not plan:
        plan = getattr(model, "_tp_plan", None)
    return dict(plan) if isinstance(plan, dict) else {}


def expanded_plan(model: nn.Module) -> dict[str, str]:
    """The plan with its patterns matched to this model's names: one entry per parameter to
    shard, then one per module to hook (transformers' own rule: a parameter takes its own pattern,
    else its module's). A tied parameter (the output head sharing the embedding's weight) is
    listed once, under its first name; `apply_tensor_plan` ties the other name back."""
    plan = declared_plan(model)
    if not plan:
        return {}
    unique = {name for name, _ in model.named_parameters()}
    expanded: dict[str, str] = {}
    for module_name, module in model.named_modules():
        generic = _wildcard(module_name)
        for param_name, _ in module.named_parameters(recurse=False):
            name = f"{module_name}.{param_name}" if module_name else param_name
            style = plan.get(_wildcard(name)) or plan.get(generic)
            if style is not None and name in unique:
                expanded[name] = style
        if generic in plan:
            expanded[module_name] = plan[generic]
    return expanded


def _wildcard(name: str) -> str:
    # transformers' `replace_layer_number_by_wildcard`: a number between dots is a layer index.
    return re.sub(r"\.\d+(\.|$)", lambda m: ".*" + m.group(1), name)


def tensor_widths(model: nn.Module) -> dict[str, int]:
    """What a tensor axis must divide, by name: the head counts (a q / k / v split must keep
    every head whole on one rank) and the width every planned parameter is split along
    (the MLP's intermediate size, the vocabulary); {} where the model has no plan."""
    plan = expanded_plan(model)
    if not plan:
        return {}
    widths: dict[str, int] = {}
    config = _text_config(model)
    for key in HEAD_COUNT_KEYS:
        count = getattr(config, key, None)
        if isinstance(count, int) and count > 0:
            widths[key] = count
    parameters = dict(model.named_parameters())
    for name, style in plan.items():
        parameter = parameters.get(name)
        if parameter is None or style not in _SPLIT_DIMS:
            continue  # a module's hook, or a style that splits no dimension
        dim, parts = _SPLIT_DIMS[style]
        if name.endswith("bias") and parameter.dim() == 1:
            if dim != -2:
                continue  # a row-wise bias is added once, whole
            dim = 0
        if parameter.dim() < (dim + 1 if dim >= 0 else -dim):
            continue
        size = parameter.shape[dim]
        label = f"{name} ({style}) width" if parts == 1 else f"each of the {parts} packed parts of {name} ({style})"
        widths[label] = size // parts
    return widths


def why_not_tensor(model: nn.Module, tensor: int) -> str | None:
    """Why `tensor` ranks cannot split this model by its plan (one line); None where they can."""
    if not declared_plan(model):
        return (
            f"{type(model).__name__} declares no tensor-parallel plan (tp_plan) in transformers "
            f"{_version()}: no tensor layout for it"
        )
    unknown = sorted(set(expanded_plan(model).values()) - set(_styles()))
    if unknown:
        return f"transformers {_version()} has no tensor-parallel style {unknown[0]!r} (from the model's tp_plan)"
    for name, width in tensor_widths(model).items():
        if width % tensor:
            return f"tensor {tensor} does not divide {name} = {width}"
    return None


def shard_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks FSDP shards one by one: the outermost modules whose class is in the model's
    ``_no_split_modules`` (its decoder layers), in order; the structural repeated blocks where it
    names none the model has."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    found: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        if type(module).__name__ in names:
            found.append(module)
            return  # a block inside a block is sharded with it
        for child in module.children():
            visit(child)

    if names:
        visit(model)
    if found:
        return found
    from tpu_tuner.model.workloads.blocks import repeated_blocks

    return repeated_blocks(model)


def same_weights_as_rank_zero(model: nn.Module) -> None:
    """Make every rank's parameters and buffers rank 0's (a broadcast each), as DDP does when it
    wraps a model: FSDP and the plan's styles split each rank's own copy, so a model built with
    random weights and no common seed would otherwise be split from N different models."""
    import torch
    import torch.distributed as dist

    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)


def apply_tensor_plan(model: nn.Module, tensor_mesh: Any) -> None:
    """Split `model` over `tensor_mesh` (a 1-D DeviceMesh) by its own plan with transformers'
    ``apply_tensor_parallelism``, then tie back the parameters it had tied (the output head and
    the embedding: both split along the vocabulary)."""
    try:
        from transformers.distributed.tensor_parallel import apply_tensor_parallelism
    except ImportError:  # transformers before its DTensor tensor-parallel path
        raise LayoutError(
            f"transformers {_version()} has no apply_tensor_parallelism: tensor layouts of its models "
            "need a newer transformers 5"
        ) from None
    aliases = _tied_aliases(model)
    plan = expanded_plan(model)
    for alias, first in aliases.items():
        style, first_style = _style_of(plan, model, alias), _style_of(plan, model, first)
        ndim = model.get_parameter(first).dim()
        if _split_dim(style, ndim) != _split_dim(first_style, ndim):
            raise LayoutError(
                f"the tied weights {first} ({first_style}) and {alias} ({style}) are split along "
                "different dimensions by the model's tp_plan"
            )
    apply_tensor_parallelism(model, tensor_mesh, plan)
    for alias, first in aliases.items():
        owner, _, attr = alias.rpartition(".")
        model.get_submodule(owner)._parameters[attr] = model.get_parameter(first)


def _tied_aliases(model: nn.Module) -> dict[str, str]:
    """Second name -> first name of every parameter the model holds under two names."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if id(parameter) in first:
            aliases[name] = first[id(parameter)]
        else:
            first[id(parameter)] = name
    return aliases


def _split_dim(style: str | None, ndim: int) -> int | None:
    """The dimension `style` splits of an `ndim`-D weight (None: it splits none)."""
    if style not in _SPLIT_DIMS:
        return None
    return _SPLIT_DIMS[style][0] % ndim


def _style_of(plan: dict[str, str], model: nn.Module, name: str) -> str | None:
    declared = declared_plan(model)
    module = name.rpartition(".")[0]
    return plan.get(name) or declared.get(_wildcard(name)) or declared.get(_wildcard(module))


def _styles() -> list[str]:
    try:  # the styles register when their module is imported
        from transformers.distributed.tensor_parallel import ALL_PARALLEL_STYLES
    except ImportError:
        return []
    return list(ALL_PARALLEL_STYLES.valid_keys())


def _text_config(model: nn.Module) -> Any:
    config = getattr(model, "config", None)
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def _version() -> str:
    return getattr(sys.modules.get("transformers"), "__version__", "?")
