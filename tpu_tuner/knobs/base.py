"""The `Knob` core: one tunable setting, from its search-space choices to how it is applied.

In the style of Optuna's samplers: a small base class, one subclass per knob, each in its own
module of `tpu_tuner.knobs`, its apply hooks (``process``, ``model``, ``forward``) no-ops by
default; what only some knobs do is an opt-in kind (`knobs/capabilities.py`). The trial worker
(`execution/step.py`, through `Candidate`) and `tpu_tuner.apply` call the same hooks, so what was
measured is what gets applied; a backend never sees a candidate (docs/design.md, "A small knob
base, opt-in kinds"; docs/knobs.md). Knob modules import torch inside their hooks only: the CLI
reads the registry before it may import torch (a bad option is refused first, docs/run-safety.md).
"""

from __future__ import annotations

import contextlib
from abc import ABC
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from torch import nn

    from tpu_tuner.devices.base import Backend

    # A backend instance, or its class where only its tables are needed (the parent process and
    # `tpu-tune apply` ask the class: the device may not be present there).
    BackendLike = Backend | type[Backend]
else:
    BackendLike = Any


class Knob(ABC):
    """One tunable setting. Values are strings in the search space's vocabulary; `default` is
    the baseline (what a candidate that does not set the knob runs)."""

    name: ClassVar[str]
    agent: ClassVar[str]  # the agent that reasons about it (agents/<agent>.toml)
    default: ClassVar[str]
    values: ClassVar[tuple[str, ...] | None] = None  # the valid values, where they are a fixed set
    device_kinds: ClassVar[tuple[str, ...] | None] = None  # the backends it applies to; None: every one
    position: ClassVar[int] = 100  # order in labels, tables and configs (lower first)
    described: ClassVar[str] = "{name} {value}"  # `describe`'s words for a value other than the default

    # --- values ------------------------------------------------------------------------------

    def check(self, value: str) -> str:
        """The canonical form of `value`; raises ValueError (naming the knob) when it is invalid."""
        if not isinstance(value, str):
            raise ValueError(f"{self.name} must be a string, not {type(value).__name__}")
        if self.values is not None and value not in self.values:
            raise ValueError(f"{self.name} must be one of {', '.join(self.values)}, not {value!r}")
        return value

    def applies_to(self, device_kind: str) -> bool:
        """Whether the knob means anything on this device kind (a config for another kind
        leaves it out)."""
        return self.device_kinds is None or device_kind in self.device_kinds

    def choices(self, device_kind: str, entry: dict[str, Any], ranks: int = 1) -> tuple[str, ...]:
        """The choices of the search-space TOML `entry` on this device (the first is the
        baseline); empty where the knob is not searched there. `ranks`: the processes each
        trial runs on (``--nproc``), which a knob placed over ranks expands its choices for."""
        if not self.applies_to(device_kind):
            return ()
        choices = tuple(entry.get("choices", {}).get(device_kind, []))
        for choice in choices:
            self.check(choice)  # spelled as the space spells it ("eager:strict"), but valid
        return choices

    # --- how a value is applied ---------------------------------------------------------------

    def process(self, value: str, backend: Backend) -> contextlib.AbstractContextManager[Any]:
        """A context that holds process-wide settings and restores them on exit."""
        return contextlib.nullcontext()

    def model(self, value: str, model: nn.Module, backend: BackendLike) -> nn.Module:
        """The model with the setting applied (in place where possible)."""
        return model

    def forward(
        self, value: str, fn: Callable[..., Any], backend: BackendLike, static_shapes: bool = False
    ) -> Callable[..., Any]:
        """`fn` (the model's forward) wrapped as the value asks. `static_shapes`: every new input
        shape compiles anew (``dynamic=False``), as TorchTPU always does."""
        return fn

    # --- reports and code ---------------------------------------------------------------------

    def describe(self, value: str) -> str:
        """A few words for labels and reports; empty for the default (it goes without saying)."""
        return "" if value == self.default else self.described.format(name=self.name, value=value)

    def label(self, value: str) -> str:
        """The knob's part of the dashboard's terse settings cell ("compile=inductor, matmul=high");
        empty where it goes without saying (the default)."""
        return "" if value == self.default else f"{self.name}={value}"

    def code(self, value: str, device_kind: str) -> list[str]:
        """Python statements that apply `value` to `model` and a batch `inputs` (the user's own
        names), runnable as printed after ``import torch``."""
        return []

    def observe(self, model: nn.Module, forward: Callable[..., Any], backend: BackendLike) -> str | None:
        """The value in force now, read back from torch, the model and its forward (called inside
        the process and step contexts); None where it cannot be read. The contract test checks
        that applying a value makes this return it, on the trial path and on the apply path."""
        return None
