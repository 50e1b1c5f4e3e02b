"""Paired comparison of interleaved timings: speedup with a bootstrap confidence interval.

Each round times candidate A and candidate B back to back, so drift between rounds (on a shared
machine, up to 2x: docs/design.md) cancels in the per-round ratio. The speedup is the geometric
mean of the ratios; its 95% interval is a percentile bootstrap over rounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BOOTSTRAP_RESAMPLES = 10_000


@dataclass(frozen=True)
class PairedSpeedup:
    """How much faster `fast` is than `slow`: >1 means faster, with a 95% interval."""

    speedup: float
    ci_low: float
    ci_high: float
    rounds: int

    @property
    def significant(self) -> bool:
        """True when the whole interval lies above 1."""
        return self.ci_low > 1.0

    def describe(self) -> str:
        return f"{self.speedup:.2f}x (95% CI {self.ci_low:.2f}-{self.ci_high:.2f}, {self.rounds} interleaved rounds)"


def paired_speedup(slow: Sequence[float], fast: Sequence[float], seed: int = 0) -> PairedSpeedup:
    """Speedup of `fast` over `slow` from per-round paired samples."""
    if len(slow) != len(fast) or len(slow) < 2:
        raise ValueError("paired samples need the same number of rounds, at least 2")
    log_ratios = np.log(np.asarray(slow, dtype=float) / np.asarray(fast, dtype=float))
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, len(log_ratios), size=(BOOTSTRAP_RESAMPLES, len(log_ratios)))
    means = log_ratios[indices].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return PairedSpeedup(
        speedup=float(np.exp(log_ratios.mean())),
        ci_low=float(np.exp(low)),
        ci_high=float(np.exp(high)),
        rounds=len(log_ratios),
    )
