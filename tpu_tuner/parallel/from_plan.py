"""A plan's ranked layouts, mapped onto the ranks at hand (for `--plan DIR` seeding).

`tpu-tune plan` ranks layouts for a TPU slice (say 256 chips); a run here has N ranks. The plan's
layouts that fit are taken in its order (fitting first, then predicted MFU), and each is scaled
down to N devices: N's prime factors go, one at a time, to the axis the planned layout gives the
most devices per local one (ties: fsdp, then tensor, then data), among the axes the factor still
divides, so the plan's dominant axis (mostly fsdp, or tensor) is the one kept; a factor no axis
takes goes to data. Each mapping says how it was made, and two
planned layouts that map to the same local one are kept once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.model.meshes.layouts import Layout


@dataclass(frozen=True)
class MappedLayout:
    """A planned layout and the local layout it maps to."""

    planned: Layout
    local: Layout
    predicted_mfu: float | None

    def describe(self) -> str:
        if self.planned == self.local:
            return f"{self.local.short()} (as planned)"
        return (
            f"{self.local.short()} on {self.local.devices} ranks from the plan's {self.planned.name()} "
            f"({self.planned.devices} devices; its dominant axis kept)"
        )


def scale_to(layout: Layout, devices: int) -> Layout:
    """`layout` scaled down to `devices` devices (see the module docstring)."""
    if devices < 1:
        raise ValueError("devices must be at least 1")
    planned = {"fsdp": layout.fsdp, "tensor": layout.tensor, "data": layout.data}  # tie order
    local = {axis: 1 for axis in planned}
    remaining = devices
    while remaining > 1:
        factor = _smallest_prime_factor(remaining)
        remaining //= factor
        takers = [axis for axis in planned if planned[axis] % (local[axis] * factor) == 0]
        axis = max(takers, key=lambda name: planned[name] / local[name]) if takers else "data"
        local[axis] *= factor
    return Layout(local["data"], local["fsdp"], local["tensor"])


def planned_layouts(plan_dir: str | Path, devices: int, top: int = 4) -> list[MappedLayout]:
    """The first `top` distinct local layouts of the plan in `plan_dir` (its plan.json) that fit."""
    path = Path(plan_dir) / "plan.json"
    try:
        plan: dict[str, Any] = json.loads(path.read_text())
        entries = plan["plans"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserInputError(f"not a plan folder (no readable plan.json with plans): {exc}", plan_dir) from None
    mapped: list[MappedLayout] = []
    for entry in entries:
        if not entry.get("fits") or not entry.get("prediction"):
            continue
        # A planned context axis runs as fsdp here (the local layouts have no context axis).
        planned = Layout.from_mesh(entry["layout"]).without_context()
        local = scale_to(planned, devices)
        if all(m.local != local for m in mapped):
            mapped.append(MappedLayout(planned, local, entry["prediction"].get("mfu")))
        if len(mapped) == top:
            break
    return mapped


def _smallest_prime_factor(n: int) -> int:
    for factor in range(2, int(n**0.5) + 1):
        if n % factor == 0:
            return factor
    return n
