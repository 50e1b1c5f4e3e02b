"""Summary statistics of timed steps: never one timing as a result."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TimingStats:
    """Spread of step times in seconds."""

    samples: list[float]
    median: float
    p10: float
    p90: float
    mean: float
    std: float

    @property
    def count(self) -> int:
        return len(self.samples)

    @property
    def cv(self) -> float:
        """Coefficient of variation (std / mean)."""
        return self.std / self.mean if self.mean else 0.0

    @property
    def robust_cv(self) -> float:
        """Spread that one outlier cannot inflate: 1.4826 x median absolute deviation / median.

        It equals the CV for normally spread times; a single slow step (a GC pause, a page fault)
        among hundreds of short ones inflates the plain CV many times over and this one barely
        (docs/mfu.md). Contention from other processes slows many steps, which this still shows.
        """
        if not self.median:
            return 0.0
        values = np.asarray(self.samples, dtype=float)
        return float(1.4826 * np.median(np.abs(values - self.median)) / self.median)

    @classmethod
    def from_samples(cls, samples: Sequence[float]) -> TimingStats:
        if len(samples) == 0:
            raise ValueError("no timing samples")
        values = np.asarray(samples, dtype=float)
        return cls(
            samples=[float(v) for v in values],
            median=float(np.median(values)),
            p10=float(np.percentile(values, 10)),
            p90=float(np.percentile(values, 90)),
            mean=float(values.mean()),
            std=float(values.std(ddof=1)) if len(values) > 1 else 0.0,
        )
