"""The `matmul_precision` knob: ``torch.set_float32_matmul_precision``, process-wide.

TPU: TorchTPU patches ``torch.set_float32_matmul_precision`` on a TPU host: medium / high / highest
set ``torch.tpu.Precision.DEFAULT`` / ``HIGH`` / ``HIGHEST`` (XLA's 1 / 3 / 6 bf16 passes), and its
global default is DEFAULT, so on TPU the baseline is medium (the search spaces list it first);
CUDA: high/medium allow TF32; CPU: medium may run fp32 matmuls as bf16 (AMX hosts), and high is
the same as highest. ``torch.tpu.precision(...)`` (a per-block override) is not used: it breaks
the graph under torch.compile.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from tpu_tuner.knobs.base import BackendLike, Knob
from tpu_tuner.knobs.capabilities import DeviceBaseline, Flag, LeavesMemory, PickedByFlags, SetsComputeDtype

if TYPE_CHECKING:
    from torch import nn

    from tpu_tuner.devices.base import Backend

# The precision a device runs user code at when nothing sets one, where it is not the knob's
# default: TorchTPU's global default is Precision.DEFAULT, i.e. medium (one bf16 pass).
_DEVICE_DEFAULTS = {"tpu": "medium"}


def device_default(device_kind: str | None) -> str:
    """The matmul precision `device_kind` runs unchanged code at: a baseline ("the user's code as
    it runs there") sets this one, not the knob's default (highest, torch's on CPU and CUDA)."""
    return _DEVICE_DEFAULTS.get(device_kind or "", MatmulPrecisionKnob.default)


class MatmulPrecisionKnob(Knob, DeviceBaseline, PickedByFlags, SetsComputeDtype, LeavesMemory):
    name = "matmul_precision"
    agent = "precision"
    default = "highest"
    position = 20
    values = ("highest", "high", "medium")

    flags = (
        Flag(
            "--precision",
            "matmul_precision",
            "torch.set_float32_matmul_precision (default: the device's own: highest on CPU and GPU, "
            "medium on TPU, TorchTPU's one-pass default)",
            choices=values,
        ),
    )

    def from_fields(self, fields: Mapping[str, Any]) -> str | None:
        return fields.get("matmul_precision")

    def device_default(self, device_kind: str | None) -> str:
        return device_default(device_kind)

    def compute_dtype(self, value: str, dtype: str, backend: Backend) -> str:
        return backend.matmul_dtype(value)

    @contextlib.contextmanager
    def process(self, value: str, backend: Backend) -> Iterator[None]:
        import torch

        previous = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(value)
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(previous)

    def describe(self, value: str) -> str:
        return f"matmul {value}"  # always named: reports read "eager, matmul highest" for the baseline

    def label(self, value: str) -> str:
        return f"matmul={value}"  # always named, as in `describe`

    def code(self, value: str, device_kind: str) -> list[str]:
        return [f'torch.set_float32_matmul_precision("{value}")']

    def observe(self, model: nn.Module, forward: Callable[..., Any], backend: BackendLike) -> str | None:
        import torch

        return torch.get_float32_matmul_precision()
