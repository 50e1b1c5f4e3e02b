"""The `xla_optimization_level` knob: XLA's optimization effort for what TorchTPU compiles.

torch-tpu 0.2.0's ``torch.tpu.compiler.custom_compiler_options`` (``_internal/compiler_options``):
a context manager that pushes XLA compiler options, its special key ``xla_optimization_level``
taking ``O0`` .. ``O3`` (XLA's ``EffortLevel``); ``default`` pushes nothing: the compiler's own level.
Applied as a process setting (the `process` hook), which the trial worker enters around building
and running every step of the trial, outside any ``torch.compile`` region: eager ops and a graph
compiled there take the level. Why that is allowed though the API is ``forbid_in_torch_compile``,
and why ``TORCH_TPU_INTERNAL_XLA_OPTIONS`` is not used: docs/knobs.md, "TorchTPU's levers". Not
measured on a chip: in the opt-in ``torchtpu`` space only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from tpu_tuner.knobs.base import BackendLike, Knob

if TYPE_CHECKING:
    from torch import nn

    from tpu_tuner.devices.base import Backend

DEFAULT = "default"
LEVELS = ("O0", "O1", "O2", "O3")
OPTION = "xla_optimization_level"  # the special key custom_compiler_options documents
# The levels this knob has pushed and not yet popped, innermost last: torch-tpu 0.2.0 has no
# reader of the pushed options, so `observe` reads what the knob itself put in force.
_PUSHED: list[str] = []


class XlaOptimizationLevelKnob(Knob):
    """``default`` or an XLA effort level ``O0`` .. ``O3`` (TorchTPU only)."""

    name = "xla_optimization_level"
    agent = "compile"
    default = DEFAULT
    position = 12
    values = (DEFAULT, *LEVELS)
    device_kinds = ("tpu",)
    described = "XLA optimization level {value}"

    def check(self, value: str) -> str:
        if isinstance(value, str) and value.upper() in LEVELS:
            value = value.upper()  # "o2" is O2: XLA's spelling
        if not isinstance(value, str) or value not in self.values:
            raise ValueError(f"xla_optimization_level must be one of {', '.join(self.values)}, not {value!r}")
        return value

    def process(self, value: str, backend: Backend) -> contextlib.AbstractContextManager[Any]:
        return compiler_options(value)

    def code(self, value: str, device_kind: str) -> list[str]:
        if value == DEFAULT:
            return []
        return [
            "# TorchTPU: every op compiled from here on (outside torch.compile regions) at this XLA level;",
            "# keep the reference: the context pops its options when it is collected",
            f'xla_options = torch.tpu.compiler.custom_compiler_options({{"{OPTION}": "{value}"}})',
            "xla_options.__enter__()",
        ]

    def observe(self, model: nn.Module, forward: Callable[..., Any], backend: BackendLike) -> str | None:
        return _PUSHED[-1] if _PUSHED else DEFAULT


@contextlib.contextmanager
def compiler_options(value: str) -> Iterator[None]:
    """TorchTPU's compiler options at level `value` for a block (nothing for ``default``)."""
    if value == DEFAULT:
        yield
        return
    import torch

    with torch.tpu.compiler.custom_compiler_options({OPTION: value}):  # type: ignore[attr-defined]  # torch.tpu: torch-tpu's
        _PUSHED.append(value)
        try:
            yield
        finally:
            _PUSHED.pop()
