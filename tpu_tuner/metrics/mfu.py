"""MFU arithmetic, kept in one place so every report computes it the same way.

The only code that divides model FLOPs by time and a peak: the profile, the trial worker, the
tuning result and report, the planner's prediction and its calibration all call these functions,
and the peak an MFU divides by is chosen here too (`fastest_peak`, `checked_peak`, `common_peak`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import numpy as np

# A float, or a numpy array of them (the planner's calibration evaluates many constants at once).
_Seconds = TypeVar("_Seconds", float, "np.ndarray")


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


def share_of_peak(seconds_at_peak: _Seconds, step_seconds: _Seconds) -> _Seconds:
    """The share of the peak a step reaches: the time its FLOPs would take at the peak over the
    time it took. With model FLOPs this is the MFU; with counted FLOPs, the roofline's compute
    share. Element-wise on numpy arrays; no checks, since an array cannot be tested as one value."""
    return seconds_at_peak / step_seconds


# The one convention every report states and every MFU figure (baseline and trials) follows.
MFU_CONVENTION = (
    "MFU = model FLOP/s / the device's peak for its fastest dense dtype "
    "(TPU: bf16 per chip; GPU: datasheet dense bf16; CPU: the best measured matmul rate of fp32 and bf16)"
)

# Ties between equal peaks (a GPU's bf16 and fp16) go to the dtype MFU is usually quoted in.
_DTYPE_PREFERENCE = ("bfloat16", "float16", "tf32", "float32")


def fastest_peak(flops_per_s: Mapping[str, float]) -> tuple[float, str]:
    """The device's peak for MFU: the highest FLOP/s of any dtype, and that dtype."""
    if not flops_per_s:
        raise ValueError("no peak FLOP/s for any dtype")

    def rank(item: tuple[str, float]) -> tuple[float, int]:
        dtype, value = item
        preference = _DTYPE_PREFERENCE.index(dtype) if dtype in _DTYPE_PREFERENCE else len(_DTYPE_PREFERENCE)
        return value, -preference

    dtype, value = max(flops_per_s.items(), key=rank)
    return float(value), dtype


@dataclass(frozen=True)
class PeakChoice:
    """The peak an MFU figure divides by, and why it differs from the device's table, if it does."""

    flops_per_s: float
    dtype: str
    note: str | None = None  # set when the step beat the table peak
    raised_to_achieved: bool = False


def checked_peak(
    achieved: float,
    peak: float,
    dtype: str,
    remeasure: Callable[[], tuple[float, str] | None] | None = None,
) -> PeakChoice:
    """The peak for an MFU figure that is never stated above 100%.

    A step faster than a measured peak means the peak is wrong (a probe measured under load):
    re-measure it with `remeasure` (returns the new fastest peak, or None where the peak is a
    published figure); if the step still beats it, the achieved rate becomes the peak and the note
    says so. A published peak stays: the step's figure is wrong, and `mfu_text` says no MFU.
    """
    if achieved <= peak:
        return PeakChoice(peak, dtype)
    note = f"the step ran at {achieved / 1e9:.4g} GFLOP/s, above the {dtype} peak of {peak / 1e9:.4g} GFLOP/s"
    fresh = remeasure() if remeasure is not None else None
    if fresh is not None:
        peak, dtype = max((peak, dtype), fresh)
        note += f"; re-measured, the peak is now {peak / 1e9:.4g} GFLOP/s ({dtype})"
    if achieved <= peak:
        return PeakChoice(peak, dtype, note)
    if remeasure is not None and fresh is None:
        # A published peak (a chip's datasheet figure): no step beats it, so raising it to the
        # achieved rate would print a false "100%" (a GPT block's on a v5e chip did).
        note += (
            "; that is the device's published peak, which no step can beat: the step was timed before "
            "the device finished or its FLOP count is wrong, so no MFU is stated"
        )
        return PeakChoice(peak, dtype, note)
    note += "; MFU uses the achieved rate as the peak (100%): the peak or the FLOP count is wrong"
    return PeakChoice(achieved, dtype, note, raised_to_achieved=True)


NO_MFU = "n/a (faster than the device's peak: mistimed or miscounted)"


def mfu_text(value: float, digits: int = 1) -> str:
    """An MFU figure to print: a percentage, or why none is stated where it exceeds 100% (only a
    step that beat a published peak keeps such a figure: `checked_peak`)."""
    return f"{value:.{digits}%}" if value <= 1.0 + 1e-9 else NO_MFU


def common_peak(peaks: Iterable[tuple[float, str]], default: tuple[float, str] | None = None) -> tuple[float, str]:
    """The one (FLOP/s, dtype) peak that MFU figures compared with each other divide by: the
    highest of the peaks they were measured against. A trial worker that beat its peak
    re-measured or raised it, so figures measured before and after divided by different peaks;
    on the highest they compare, and none reads above 100%. `default` when `peaks` is empty."""
    found = list(peaks)
    if not found:
        if default is None:
            raise ValueError("no peak to compare MFU figures on")
        return default
    return max(found)


def utilisation_by_dtype(achieved: float, flops_per_s: Mapping[str, float]) -> dict[str, float | None]:
    """Achieved rate over each dtype's peak; None where the step beats that dtype's peak (it
    cannot have run in that dtype alone, so the ratio means nothing and is never printed)."""
    return {dtype: (achieved / peak if 0 < peak and achieved <= peak else None) for dtype, peak in flops_per_s.items()}
