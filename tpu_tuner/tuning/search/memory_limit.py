"""The study's memory constraint: which peak memory a trial may reach and still be feasible.

`--trial-memory-gb` when the user gives it; otherwise the device's memory where the device has
memory of its own that a step fills (`Backend.memory_bounds_trials`: CUDA's, TPU's allocators' peak
is what is measured).
On CPU without `--trial-memory-gb` there is no memory constraint: the measured peak (the
worker's VmHWM) includes the Python process and shares the machine's RAM with everything else,
so the machine's total says little about what a step may use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpu_tuner.core.units import binary_bytes
from tpu_tuner.devices import backend_class


@dataclass(frozen=True)
class MemoryLimit:
    """A peak-memory bound and where it comes from (named in reasons and findings)."""

    bytes: int
    source: str  # "--trial-memory-gb" or "the device's memory"

    def request_fields(self) -> dict[str, Any]:
        """The limit as a `MeasureRequest`'s fields: the worker refuses a step estimated above it."""
        return {"memory_limit_bytes": self.bytes, "memory_limit_source": self.source}

    def exceeded_by(self, peak_bytes: int | None) -> str | None:
        """The reason a trial with this peak is infeasible, or None when it fits (or is unknown)."""
        if peak_bytes is None or peak_bytes <= self.bytes:
            return None
        return f"peak memory {binary_bytes(peak_bytes)} > {binary_bytes(self.bytes)} ({self.source})"


def memory_limit(user_limit_bytes: int | None, device_kind: str, device_memory_bytes: int | None) -> MemoryLimit | None:
    """The study's memory constraint, or None where there is none (CPU without a user limit)."""
    if user_limit_bytes:
        return MemoryLimit(int(user_limit_bytes), "--trial-memory-gb")
    if device_memory_bytes and backend_class(device_kind).memory_bounds_trials:
        return MemoryLimit(int(device_memory_bytes), "the device's memory")
    return None
