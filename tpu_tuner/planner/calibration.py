"""Fitting the prediction's constants to published runs, and its leave-one-out error.

A calibration row is one published run reduced to what the prediction needs (predict.py): the
compute time at full MXU efficiency, the memory and communication times, and the model FLOPs'
time at peak (MFU x step). Predicted MFU is then a function of the constants alone, so fits and
leave-one-out errors need no compiles (benchmarks/plan_calibration.py compiles the rows once).

Efficiency models compared (EFFICIENCY_MODELS):

* ``global``: one MXU efficiency for every generation, and one compute / memory overlap;
* ``per_generation``: an efficiency per generation, the overlap shared; a generation with no
  other row is predicted with the efficiency fitted to all other rows (so its leave-one-out
  error is that of a generation the fit never saw);
* ``mxu_shape``: physics instead of per-generation freedom: efficiency = base for a 128-wide MXU,
  x `wide_mxu` for a 256-wide one (v6e, TPU7x), whose systolic array takes four times the
  operands per cycle from the same VMEM, so it is harder to keep busy.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

EFFICIENCY_MODELS = ("global", "per_generation", "mxu_shape")
WIDE_MXU = ("v6e", "tpu7x")  # 256x256 MXUs; v4, v5e, v5p have 128x128
OVERLAP = 0.9  # communication hidden behind busy time (fixed, not fitted: predict.CostModel)
_EFFICIENCIES = [e / 100 for e in range(40, 101)]
_MEMORY_OVERLAPS = [g / 100 for g in range(0, 101, 4)]


@dataclass(frozen=True)
class CalibrationRow:
    """One published run as the prediction sees it (seconds per step, per device)."""

    number: int
    generation: str
    fits: bool
    peak_bytes: float
    hbm_bytes: float
    compute_at_full_efficiency: float
    memory_seconds: float
    comm_seconds: float
    model_seconds_at_peak: float
    published_mfu: float


@dataclass(frozen=True)
class Fitted:
    kind: str
    efficiency: dict[str, float]  # generation -> MXU efficiency ("*": the rest)
    memory_overlap: float

    def efficiency_of(self, generation: str) -> float:
        return self.efficiency.get(generation, self.efficiency["*"])

    def describe(self) -> str:
        effs = ", ".join(f"{g} {e:.2f}" for g, e in sorted(self.efficiency.items()))
        return f"MXU efficiency {effs}; memory overlap {self.memory_overlap:.2f}"


def predicted_mfu(row: CalibrationRow, efficiency: float, memory_overlap: float) -> float:
    """predict.py's MFU for the row's figures and these constants."""
    compute = row.compute_at_full_efficiency / efficiency
    memory = row.memory_seconds
    busy = max(compute, memory) + (1 - memory_overlap) * min(compute, memory)
    step = busy + max(0.0, row.comm_seconds - OVERLAP * busy)
    return row.model_seconds_at_peak / step


def errors(rows: list[CalibrationRow], fitted: Fitted) -> list[float]:
    """Predicted minus published MFU, in points, per row."""
    return [(predicted_mfu(r, fitted.efficiency_of(r.generation), fitted.memory_overlap) - r.published_mfu) * 100
            for r in rows]


def _mae(rows: list[CalibrationRow], fitted: Fitted) -> float:
    return statistics.mean(abs(e) for e in errors(rows, fitted))


def fit(rows: list[CalibrationRow], kind: str) -> Fitted:
    """The constants of `kind` that minimise the mean absolute error over `rows` (grid search:
    a handful of rows and two or three constants)."""
    if kind == "global":
        return min((Fitted(kind, {"*": e}, g) for e in _EFFICIENCIES for g in _MEMORY_OVERLAPS),
                   key=lambda f: _mae(rows, f))
    if kind == "mxu_shape":
        return min((Fitted(kind, {"*": e, **{w: e * wide for w in WIDE_MXU}}, g)
                    for e in _EFFICIENCIES for wide in [w / 100 for w in range(60, 121, 2)] for g in _MEMORY_OVERLAPS
                    if e * wide <= 1.0), key=lambda f: _mae(rows, f))
    if kind == "per_generation":
        best: Fitted | None = None
        for g in _MEMORY_OVERLAPS:
            # With the overlap fixed, each generation's efficiency only touches its own rows.
            efficiency = {"*": min(_EFFICIENCIES, key=lambda e: _mae(rows, Fitted(kind, {"*": e}, g)))}
            for generation in {r.generation for r in rows}:
                own = [r for r in rows if r.generation == generation]
                efficiency[generation] = min(_EFFICIENCIES, key=lambda e: _mae(own, Fitted(kind, {"*": e}, g)))
            candidate = Fitted(kind, efficiency, g)
            if best is None or _mae(rows, candidate) < _mae(rows, best):
                best = candidate
        assert best is not None
        return best
    raise ValueError(f"unknown efficiency model {kind!r} (known: {', '.join(EFFICIENCY_MODELS)})")


def leave_one_out(rows: list[CalibrationRow], kind: str) -> list[float]:
    """Each row's error (points) when the constants are fitted to the other rows alone."""
    return [errors([row], fit([r for r in rows if r is not row], kind))[0] for row in rows]
