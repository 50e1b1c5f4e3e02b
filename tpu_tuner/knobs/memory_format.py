"""The `memory_format` knob: channels_last for convolution models (CPU and CUDA).

``model.to(memory_format=torch.channels_last)`` re-lays every 4-D parameter (convolution
weights) as NHWC, and a forward pre-hook does the same to the 4-D tensors the model is called
with, so oneDNN / cuDNN pick their NHWC kernels without a layout conversion around every
convolution. Models without 4-D weights are unchanged (the compile agent skips the setting when
the profile shows no convolution). TorchTPU lays out tensors itself: not a knob there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tpu_tuner.knobs.base import BackendLike, Knob
from tpu_tuner.knobs.capabilities import NarrowedByWorkload

if TYPE_CHECKING:
    from torch import nn

    from tpu_tuner.knobs.traits import WorkloadTraits

CONTIGUOUS = "contiguous"
CHANNELS_LAST = "channels_last"
# Set on a model whose inputs a hook already converts, so a second `model` call adds no second hook.
INPUTS_HOOKED_MARK = "_tpu_tune_channels_last_inputs"


class MemoryFormatKnob(Knob, NarrowedByWorkload):
    name = "memory_format"
    agent = "compile"
    default = CONTIGUOUS
    position = 40
    values = (CONTIGUOUS, CHANNELS_LAST)
    described = "{value}"
    device_kinds = ("cpu", "cuda")
    not_applicable = "the model has no 4-D (convolution) weights to re-lay"

    def applies_to_workload(self, traits: WorkloadTraits) -> bool:
        return traits.conv_weights > 0  # nothing else is re-laid

    def model(self, value: str, model: nn.Module, backend: BackendLike) -> nn.Module:
        if value != CHANNELS_LAST:
            return model
        import torch

        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # documented; stubs omit it
        if not getattr(model, INPUTS_HOOKED_MARK, False):
            # Inputs too: a real batch arrives contiguous, so the conversion is part of the step
            # that is timed, as it is in the user's own loop after `apply`.
            model.register_forward_pre_hook(_channels_last_inputs, with_kwargs=True)
            setattr(model, INPUTS_HOOKED_MARK, True)
        return model

    def code(self, value: str, device_kind: str) -> list[str]:
        if value != CHANNELS_LAST:
            return []
        return [
            "model = model.to(memory_format=torch.channels_last)",
            "inputs = inputs.contiguous(memory_format=torch.channels_last)  # each 4-D input batch",
        ]

    def observe(self, model: nn.Module, forward: Callable[..., Any], backend: BackendLike) -> str | None:
        import torch

        weights = [p for p in model.parameters() if p.dim() == 4]
        if not weights:
            return None  # nothing the setting could change
        nhwc = all(p.is_contiguous(memory_format=torch.channels_last) for p in weights)
        return CHANNELS_LAST if nhwc and not all(p.is_contiguous() for p in weights) else CONTIGUOUS


def _channels_last_inputs(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    import torch

    def convert(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() == 4:
            return value.contiguous(memory_format=torch.channels_last)
        return value

    return tuple(convert(a) for a in args), {k: convert(v) for k, v in kwargs.items()}
