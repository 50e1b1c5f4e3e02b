"""The matmul efficiency of a TPU generation without calibration rows, from its published peak.

A generation the calibration has never seen used to take the median of the other generations'
fitted dense efficiencies. Across the five calibrated chips the fitted efficiency falls as the
chip's bf16 peak grows (v5e 197 TFLOP/s 0.78, v4 275 0.70, v5p 459 0.74, v6e 918 0.70, TPU7x 2307
0.63: docs/planner.md, issue 70): a faster chip's MXUs finish their share of a step sooner, while
the work they wait on (vector and scalar units, DMA issue, each op's fixed cost) grows less from
one generation to the next, so a step reaches a smaller share of the peak. The prior is that
trend, a straight line in the logarithm of the peak per chip, fitted by least squares to the
other generations' dense efficiencies; the peak is Google's published figure per chip
(core/hardware.py: https://cloud.google.com/tpu/docs/v4, .../v5e, .../v5p, .../v6e, .../tpu7x).

Measured against the alternatives on leave-one-generation-out (benchmarks/planner/plan_bands.py,
docs/planner.md): the log of the peak per chip beat the median chip and lines in the machine
balance (peak / HBM bandwidth), HBM bandwidth, HBM size and ICI bandwidth per FLOP.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from tpu_tuner.core.hardware import TPU_CHIPS

# Bounds on a prior's efficiency: a line extrapolated far past the calibrated peaks must not
# predict a chip above its peak or at a share no calibrated step came near (the fit's own grid
# starts at 0.2: fitting._EFFICIENCIES).
LOWEST, HIGHEST = 0.2, 1.0


def _log_peak(generation: str) -> float | None:
    chip = TPU_CHIPS.get(generation)
    return math.log(chip.bf16_tflops_per_chip) if chip is not None else None


def efficiency_prior(dense: Mapping[str, float], generation: str) -> float | None:
    """The dense matmul efficiency `generation` is predicted with when it has no calibration row:
    the least-squares line of `dense` (generation -> fitted dense efficiency, `generation` itself
    ignored) in the log of each chip's bf16 peak, at `generation`'s peak. None where the line
    cannot be drawn: `generation`'s peak unknown, or fewer than two other generations with
    distinct known peaks (the caller then keeps its own fallback)."""
    target = _log_peak(generation)
    points = [(x, e) for g, e in dense.items() if g != generation and (x := _log_peak(g)) is not None]
    if target is None or len({x for x, _ in points}) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_e = sum(e for _, e in points) / len(points)
    slope = sum((x - mean_x) * (e - mean_e) for x, e in points) / sum((x - mean_x) ** 2 for x, _ in points)
    return min(HIGHEST, max(LOWEST, mean_e + slope * (target - mean_x)))
