"""The workload: what a user's model file provides, with no tuning knobs in it.

A `Workload` knows how to build the model, make a batch of a given size, and (for training) the
loss and optimizer. It is loaded from a file by `tpu_tuner.model.workloads.loader.load_workload`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from tpu_tuner.model.decoders.transformer_dims import TransformerDims

ModelInputs = Any  # a tensor, a tuple/list of positional inputs, or a dict of keyword inputs
Batch = Any  # inference: ModelInputs; training: (ModelInputs, target)


@dataclass
class Workload:
    """A model plus the batches it runs on, as the user's file defines them."""

    name: str
    source: Path
    build_model: Callable[[], nn.Module]
    make_batch: Callable[[int | None, int | None], Batch]  # None: the file's default size
    batch_size: int | None
    seq_len: int | None
    convention: Literal["native", "benchmark"]
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None
    make_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None = None
    sample_lengths: Callable[[], Sequence[int]] | None = None
    model_flops: Callable[[int | None, int | None, bool], float] | None = None
    transformer: TransformerDims | None = None
    presets: tuple[str, ...] = ()
    transformer_for_preset: Callable[[str], dict[str, Any]] | None = None
    notes: list[str] = field(default_factory=list)
    # A Hugging Face model (an ``hf:`` source): its transformers config and the task its step runs.
    hf_config: Any = None
    hf_task: str | None = None

    def model_for_preset(self, preset: str | None) -> torch.nn.Module:
        """Build the model at a named size (``PRESETS`` in the file), or the default one."""
        if preset is None:
            return self.build_model()
        if preset not in self.presets:
            from tpu_tuner.core.errors import WorkloadError

            known = ", ".join(self.presets) or "none"
            raise WorkloadError(f"no preset {preset!r}; the file defines: {known}", self.source)
        return self.build_model(preset=preset)  # type: ignore[call-arg]  # a file with PRESETS takes a preset

    def dims_for_preset(self, preset: str | None) -> TransformerDims | None:
        """The attention shape at a preset (``transformer_dims(preset)`` in the file), else the default."""
        if preset is not None and self.transformer_for_preset is not None:
            return TransformerDims(**self.transformer_for_preset(preset))
        return self.transformer

    @property
    def is_training(self) -> bool:
        """A workload with a loss is a training step (forward, backward, optimizer step)."""
        return self.loss_fn is not None

    @property
    def step_kind(self) -> str:
        from tpu_tuner.model.workloads.profiled import step_kind

        return step_kind(self.is_training)

    def batch(self, batch_size: int | None = None, seq_len: int | None = None) -> Batch:
        """Make one batch at the given (or default) batch size and sequence length."""
        return self.make_batch(batch_size or self.batch_size, seq_len or self.seq_len)

    def split_batch(self, batch: Batch) -> tuple[ModelInputs, Any]:
        """Split a batch into (model inputs, loss target); the target is None for inference."""
        if not self.is_training:
            return batch, None
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            raise TypeError(
                f"a training workload's make_batch must return (inputs, target), got {type(batch).__name__}"
            )
        return batch[0], batch[1]

    def optimizer_for(self, model: nn.Module) -> torch.optim.Optimizer | None:
        """The optimizer of a training step (AdamW, lr 1e-4, unless the file gives one)."""
        if not self.is_training:
            return None
        if self.make_optimizer is not None:
            return self.make_optimizer(model.parameters())
        return torch.optim.AdamW(model.parameters(), lr=1e-4)


def call_model(model: Callable[..., Any], inputs: ModelInputs) -> Any:
    """Call a model on inputs the way the benchmark convention does: *tuple, **dict, or one arg."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


class ModelWithLoss(nn.Module):
    """The model and its loss as one module, ``(inputs, target) -> loss``: what a compiler handed
    both traces as one graph (the loss fused with the output head, its logits never written out
    whole)."""

    def __init__(self, model: nn.Module, loss_fn: Callable[[Any, Any], torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, inputs: ModelInputs, target: Any) -> torch.Tensor:
        return self.loss_fn(call_model(self.model, inputs), target)


def loss_of(forward: Callable[..., Any], loss_fn: Callable[[Any, Any], torch.Tensor]) -> Callable[[Any, Any], Any]:
    """``(inputs, target) -> loss``: `loss_fn` on the output of `forward` (compiled or not), the
    loss computed outside whatever compiled the forward."""
    return lambda inputs, target: loss_fn(call_model(forward, inputs), target)


def move_to(obj: Any, device: torch.device | str) -> Any:
    """Move every tensor in a nested tuple/list/dict structure to `device`."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {key: move_to(value, device) for key, value in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(move_to(value, device) for value in obj)
    return obj
