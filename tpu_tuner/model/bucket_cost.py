"""What a planned run costs under a bucketing: compiles plus padded steps.

The model, stated so it can be checked (`benchmarks/bucketing_replay.py` measures it):

* every distinct bucket bound is compiled once, at `compile_seconds` (measured: the first call at
  a new shape minus a steady step, median over the probed lengths);
* a step at padded length L takes t(L) = a + b L + c L^2 seconds, fitted by non-negative least
  squares to steady step times measured at several lengths (the quadratic term is attention's);
  non-negative coefficients keep t increasing in L, which the optimiser relies on;
* a run of S steps draws each step's length from the sample's distribution; a step runs at the
  smallest bound that holds its length (bucketed pipelines batch a bucket's requests together).

expected total = (compiled bounds) x compile_seconds + S x sum_L p(L) t(bound(L)).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import nnls


@dataclass(frozen=True)
class BucketCostModel:
    compile_seconds: float
    coefficients: tuple[float, float, float]  # a, b, c of t(L) = a + b L + c L^2 (seconds)
    fit_max_relative_error: float = 0.0
    fit_points: list[tuple[int, float]] = field(default_factory=list)  # (length, measured seconds)
    compile_samples: list[tuple[int, float]] = field(default_factory=list)  # (length, measured seconds)

    def step_seconds(self, length: float | np.ndarray) -> float | np.ndarray:
        a, b, c = self.coefficients
        return a + b * length + c * np.square(length)

    def describe(self) -> str:
        a, b, c = self.coefficients
        return (
            f"t(L) = {a * 1e3:.3g} ms + {b * 1e6:.3g} us x L + {c * 1e9:.3g} ns x L^2 "
            f"(max error {self.fit_max_relative_error:.1%} over {len(self.fit_points)} lengths); "
            f"{self.compile_seconds:.2f} s per new shape"
        )


def fit_cost_model(
    step_points: Sequence[tuple[int, float]], compile_points: Sequence[tuple[int, float]]
) -> BucketCostModel:
    """Fit t(L) by non-negative least squares, weighted by 1/t so every length's relative error
    counts alike; the compile cost is the median of the measured ones."""
    if len(step_points) < 2:
        raise ValueError("fitting step time against length needs at least two measured lengths")
    lengths = np.array([p[0] for p in step_points], dtype=float)
    seconds = np.array([p[1] for p in step_points], dtype=float)
    design = np.stack([np.ones_like(lengths), lengths, lengths**2], axis=1)
    weights = 1.0 / seconds
    if len(step_points) < 3:
        design = design[:, :2]  # two points fix a line, not a parabola
    solution, _ = nnls(design * weights[:, None], seconds * weights)
    a, b, c = (float(x) for x in np.pad(solution, (0, 3 - len(solution))))
    predicted = design @ solution
    error = float(np.max(np.abs(predicted - seconds) / seconds))
    compile_seconds = float(np.median([p[1] for p in compile_points])) if compile_points else 0.0
    return BucketCostModel(
        compile_seconds,
        (a, b, c),
        error,
        [(length, secs) for length, secs in step_points],
        [(length, secs) for length, secs in compile_points],
    )
