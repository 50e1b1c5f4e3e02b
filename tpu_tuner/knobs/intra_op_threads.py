"""The `intra_op_threads` knob: ``torch.set_num_threads`` on CPU, process-wide.

Fewer threads than torch's default (the physical core count) can win where the ops are small or
other work shares the cores. The space's symbolic choices are resolved on the host at hand:
``all`` (torch's default, left untouched: the baseline), ``half`` (half the cores this process may
run on), ``1``, or a plain number; counts at or above the usable cores and repeats are dropped, and
a candidate holds the resolved count, so a tuned config applies the count that was measured. Why,
and why CPU only: docs/knobs.md, "`intra_op_threads`: fewer CPU threads than cores".
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from tpu_tuner.core.host import usable_cores
from tpu_tuner.knobs.base import BackendLike, Knob
from tpu_tuner.knobs.capabilities import LeavesMemory

if TYPE_CHECKING:
    from torch import nn

    from tpu_tuner.devices.base import Backend

ALL = "all"
HALF = "half"

# torch.get_num_threads() as the knob first found it in this process: what "all" reads back as.
_torch_default: int | None = None


def torch_default_threads() -> int:
    """torch's intra-op thread count as this process had it before the knob changed anything."""
    global _torch_default
    if _torch_default is None:
        import torch

        _torch_default = torch.get_num_threads()
    return _torch_default


class IntraOpThreadsKnob(Knob, LeavesMemory):
    name = "intra_op_threads"
    agent = "threads"
    default = ALL
    position = 50
    device_kinds = ("cpu",)

    def check(self, value: str) -> str:
        """``all``, or a positive thread count (``half`` resolves to half the usable cores)."""
        value = super().check(value)
        if value in (ALL, HALF):
            return value if value == ALL else str(max(1, usable_cores() // 2))
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{self.name} must be 'all', 'half' or a positive thread count, not {value!r}")
        return str(int(value))

    def choices(self, device_kind: str, entry: dict[str, Any], ranks: int = 1) -> tuple[str, ...]:
        """``all`` first, then the resolved counts below the usable cores (a rank's share of them
        when `ranks` processes share the host: each starts with that many), each once."""
        if not self.applies_to(device_kind):
            return ()
        cores = max(1, usable_cores() // ranks)
        resolved: list[str] = [ALL]
        for choice in entry.get("choices", {}).get(device_kind, []):
            value = self.check(choice)
            if value != ALL and int(value) < cores and value not in resolved:
                resolved.append(value)
        return tuple(resolved)

    @contextlib.contextmanager
    def process(self, value: str, backend: Backend) -> Iterator[None]:
        import torch

        torch_default_threads()  # note the default before anything changes it
        previous = torch.get_num_threads()
        if value != ALL:
            torch.set_num_threads(int(value))
        try:
            yield
        finally:
            torch.set_num_threads(previous)

    def describe(self, value: str) -> str:
        return "" if value == ALL else f"{value} thread" + ("" if value == "1" else "s")

    def code(self, value: str, device_kind: str) -> list[str]:
        return [] if value == ALL else [f"torch.set_num_threads({int(value)})"]

    def observe(self, model: nn.Module, forward: Callable[..., Any], backend: BackendLike) -> str | None:
        import torch

        count = torch.get_num_threads()
        return ALL if count == torch_default_threads() else str(count)
