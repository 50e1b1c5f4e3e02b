"""A device's peak FLOP/s per dtype and memory bandwidth: from a datasheet or a measured probe."""

from __future__ import annotations

from dataclasses import dataclass

from tpu_tuner.metrics.mfu import fastest_peak


@dataclass(frozen=True)
class DevicePeak:
    """Peak FLOP/s per dtype and memory bandwidth of one device, with where they came from."""

    flops_per_s: dict[str, float]  # dtype name ("float32", "bfloat16", "tf32", ...) -> FLOP/s
    memory_bytes_per_s: float | None
    source: str  # e.g. "Google TPU spec table" or "measured roofline probe (...)"

    def fastest(self) -> tuple[float, str]:
        """The peak MFU divides by: the fastest dense dtype's FLOP/s (docs/mfu.md)."""
        return fastest_peak(self.flops_per_s)
