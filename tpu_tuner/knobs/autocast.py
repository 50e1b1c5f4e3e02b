"""The `autocast` knob: ``torch.autocast`` around each step's forward and loss."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tpu_tuner.knobs.base import BackendLike, Knob
from tpu_tuner.knobs.capabilities import Flag, PickedByFlags, SetsComputeDtype, StepContext

if TYPE_CHECKING:
    from torch import nn

    from tpu_tuner.devices.base import Backend

NONE = "none"


class AutocastKnob(Knob, PickedByFlags, SetsComputeDtype, StepContext):
    name = "autocast"
    agent = "precision"
    default = NONE
    position = 30
    values = (NONE, "bfloat16", "float16")

    flags = (
        Flag(
            "--autocast",
            "autocast_dtype",
            "run under torch.autocast with this dtype",
            choices=values[1:],  # after "none", the default
        ),
    )

    def from_fields(self, fields: Mapping[str, Any]) -> str | None:
        return fields.get("autocast_dtype")

    def compute_dtype(self, value: str, dtype: str, backend: Backend) -> str:
        if value == NONE:
            return dtype
        return backend.autocast_matmul_dtype(value) or dtype

    def step(self, value: str, backend: BackendLike) -> contextlib.AbstractContextManager[Any]:
        if value == NONE:
            return contextlib.nullcontext()
        import torch

        # Backend kinds are torch device types ("cpu", "cuda", "tpu").
        return torch.autocast(backend.kind, dtype=getattr(torch, value))

    def step_code(self, value: str, device_kind: str) -> str | None:
        return None if value == NONE else f'torch.autocast("{device_kind}", dtype=torch.{value})'

    def observe(self, model: nn.Module, forward: Callable[..., Any], backend: BackendLike) -> str | None:
        import torch

        if not torch.is_autocast_enabled(backend.kind):
            return NONE
        return str(torch.get_autocast_dtype(backend.kind)).removeprefix("torch.")
