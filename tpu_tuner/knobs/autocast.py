"""The `autocast` knob: ``torch.autocast`` around each step's forward and loss."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tpu_tuner.knobs.base import BackendLike, Knob

if TYPE_CHECKING:
    from torch import nn

    from tpu_tuner.devices.base import Backend

NONE = "none"


class AutocastKnob(Knob):
    name = "autocast"
    agent = "precision"
    default = NONE
    position = 30
    values = (NONE, "bfloat16", "float16")

    legacy_fields = ("autocast_dtype",)

    def from_legacy_fields(self, fields: Mapping[str, Any]) -> str | None:
        return fields.get("autocast_dtype") or NONE

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


# Choices of the `tpu-tune profile --autocast` flag (read without importing torch).
AUTOCAST_DTYPES = tuple(v for v in AutocastKnob.values or () if v != NONE)
