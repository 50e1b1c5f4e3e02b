"""MFU arithmetic, kept in one place so every report computes it the same way."""

from __future__ import annotations


def achieved_flops_per_s(flops_per_step: float, step_seconds: float) -> float:
    """FLOP/s of a step that does `flops_per_step` in `step_seconds`."""
    if step_seconds <= 0:
        raise ValueError("step time must be positive")
    return flops_per_step / step_seconds


def mfu(flops_per_step: float, step_seconds: float, peak_flops_per_device: float, devices: int = 1) -> float:
    """Model FLOPs utilisation: model FLOP/s over the peak FLOP/s of all devices used."""
    if peak_flops_per_device <= 0 or devices <= 0:
        raise ValueError("peak FLOP/s and device count must be positive")
    return achieved_flops_per_s(flops_per_step, step_seconds) / (peak_flops_per_device * devices)
