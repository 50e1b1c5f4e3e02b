"""The `activation_checkpointing` knob: recompute repeated blocks in the backward pass (training).

A memory knob: a checkpointed block keeps only its inputs for the backward pass and runs its
forward again there, so the step's peak memory drops (roughly by the blocks' saved activations)
at the cost of one more forward of each checkpointed block. The study sees both: the step time is
the objective, the peak memory a constraint (`--trial-memory-gb`, or the device's memory on
CUDA/TPU). How the repeated blocks are found and wrapped, a Hugging Face model's own switch, and
why it holds on TPU: docs/knobs.md, "`activation_checkpointing`: memory saved at a time cost" and
docs/hf-models.md.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tpu_tuner.core.errors import WorkloadError
from tpu_tuner.knobs.base import BackendLike, Knob
from tpu_tuner.knobs.capabilities import NarrowedByWorkload
from tpu_tuner.model.workloads.blocks import declared_blocks, model_blocks

if TYPE_CHECKING:
    from torch import nn

    from tpu_tuner.knobs.traits import WorkloadTraits

NONE = "none"
BLOCKS = "blocks"
EVERY_2ND = "every_2nd"
# value -> checkpoint every n-th repeated block, starting with the first.
_EVERY = {BLOCKS: 1, EVERY_2ND: 2}
_MARK = "_tpu_tune_checkpointed"


class ActivationCheckpointingKnob(Knob, NarrowedByWorkload):
    name = "activation_checkpointing"
    agent = "memory"
    default = NONE
    position = 60
    values = (NONE, BLOCKS, EVERY_2ND)
    device_kinds = ("cpu", "cuda", "tpu")
    not_applicable = "it needs a training step and a model with two or more like blocks"

    def applies_to_workload(self, traits: WorkloadTraits) -> bool:
        # Without grad nothing is kept for a backward pass; without two like blocks nothing to pick.
        return traits.training and traits.repeated_blocks >= 2

    def model(self, value: str, model: nn.Module, backend: BackendLike) -> nn.Module:
        if value == NONE:
            return model
        return checkpoint_blocks(model, every=_EVERY[value])

    def describe(self, value: str) -> str:
        return {BLOCKS: "checkpointed blocks", EVERY_2ND: "every 2nd block checkpointed"}.get(value, "")

    def code(self, value: str, device_kind: str) -> list[str]:
        if value == NONE:
            return []
        # The trial worker's own function: the same blocks, the same wrapper (a transformers
        # model's own switch for every block).
        return [
            "from tpu_tuner.knobs.activation_checkpointing import checkpoint_blocks",
            f"model = checkpoint_blocks(model, every={_EVERY[value]})  # recompute repeated blocks in backward",
        ]

    def observe(self, model: nn.Module, forward: Callable[..., Any], backend: BackendLike) -> str | None:
        blocks = model_blocks(model)
        if not blocks:
            return NONE
        pattern = [bool(getattr(block, _MARK, False)) for block in blocks]
        for value, every in _EVERY.items():
            if pattern == [i % every == 0 for i in range(len(blocks))]:
                return value
        return NONE if not any(pattern) else None


def checkpoint_blocks(model: nn.Module, every: int = 1) -> nn.Module:
    """Checkpoint every `every`-th repeated block of `model` (in place; returned for chaining):
    its forward runs under ``torch.utils.checkpoint.checkpoint(use_reentrant=False)`` whenever
    gradients are recorded. Raises WorkloadError when the model has no repeated blocks."""
    if _own_switch(model, every):
        return model
    blocks = model_blocks(model)
    if not blocks:
        raise WorkloadError(
            f"activation checkpointing needs repeated blocks (an nn.ModuleList or nn.Sequential "
            f"of two or more modules of one class) and {type(model).__name__} has none"
        )
    for index, block in enumerate(blocks):
        if index % every == 0 and not getattr(block, _MARK, False):
            # A partial over the block, not a closure over its bound forward: a deep copy of the
            # model (the accuracy reference) then calls its own copy of the block.
            block.forward = functools.partial(_checkpointed_forward, block)
            setattr(block, _MARK, True)
    return model


def _own_switch(model: nn.Module, every: int) -> bool:
    """Checkpoint through a transformers model's own switch; False where it has none for `every`."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        return False
    kwargs = {"use_reentrant": False}
    blocks = declared_blocks(model)
    if takes_every_n_layers(model):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs, every_n_layers=every)  # type: ignore[operator]  # nn.Module.__getattr__'s type
    elif hasattr(model, "gradient_checkpointing_enable") and (every == 1 or _layers_own_flag(blocks)):
        # transformers before `activation_checkpointing_enable` (5.17, the chip's): every layer's
        # own flag on, then off but on every n-th. Why not this module's wrapper: docs/knobs.md.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # type: ignore[operator]  # as above
        for index, block in enumerate(blocks):
            if index % every:
                block.gradient_checkpointing = False  # type: ignore[assignment]  # a plain attribute, which mypy reads as a submodule
    else:
        return False
    for block in blocks:
        setattr(block, _MARK, bool(getattr(block, "gradient_checkpointing", False)))
    return True


def takes_every_n_layers(model: nn.Module) -> bool:
    """Whether `model` has transformers' ``activation_checkpointing_enable(every_n_layers=...)``
    (after 5.17)."""
    return hasattr(model, "activation_checkpointing_enable")


def _layers_own_flag(blocks: list[nn.Module]) -> bool:
    """Whether every block checkpoints itself by its own ``gradient_checkpointing`` flag
    (transformers' ``GradientCheckpointingLayer``), so that layers can be left out one by one."""
    return bool(blocks) and all(
        isinstance(getattr(type(block), "gradient_checkpointing", None), bool) for block in blocks
    )


def _checkpointed_forward(block: nn.Module, *args: Any, **kwargs: Any) -> Any:
    import torch
    from torch.utils.checkpoint import checkpoint

    forward = type(block).forward.__get__(block)
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)  # nothing is kept for a backward pass: nothing to save
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)
