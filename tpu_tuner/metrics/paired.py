"""Paired comparison of interleaved timings: a speedup with its interval, and the verdict it allows.

Each round times candidate A and candidate B back to back, so drift between rounds (on a shared
machine, up to 2x: docs/design.md) cancels in the per-round ratio. The speedup is the geometric
mean of the ratios; its interval is Student's t interval on the mean of the log ratios, at a
stated level (95% by default). A verification that adds rounds until it decides looks at the
interval more than once; `look_level` spends its 5% over the looks so that the chance any look
claims a gain that is not there stays under 2.5% however many looks it takes (docs/tuning.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from scipy import stats

# A gain under 5% is not worth a different setting: an interval wholly below this is "no gain".
MIN_GAIN = 1.05
# An interval is precise enough to stop adding rounds once its lower end is at least this share
# of the estimate (1.97x [1.36-2.79], issue 38, is not; 2.03x [2.00-2.07] is).
PRECISE_SHARE = 0.8
ALPHA = 0.05


class VerdictKind(StrEnum):
    """What an interleaved verification concluded (stored as its value in result.json)."""

    VERIFIED = "verified"  # the interval lies above 1
    NO_GAIN = "no gain"  # the interval lies below MIN_GAIN (slower included)
    UNDECIDED = "undecided"  # neither, when the clock or the rounds ran out
    NOT_VERIFIED = "not verified"  # no comparison ran (a failed baseline, a failed window)


@dataclass(frozen=True)
class PairedSpeedup:
    """How much faster `fast` is than `slow`: >1 means faster, with an interval at `level`."""

    speedup: float
    ci_low: float
    ci_high: float
    rounds: int
    level: float = 0.95
    # One of a window's looks (`look_level`): its level is the look's share of ALPHA, and what it
    # is stated as is the whole sequence's, 95% in every run (not 96.96% in one, 99.24% in another).
    overall: bool = False

    @property
    def stated_level(self) -> float:
        """The level the interval is stated at: the sequence's where it is one of its looks."""
        return 1.0 - ALPHA if self.overall else self.level

    @property
    def significant(self) -> bool:
        """True when the whole interval lies above 1."""
        return self.ci_low > 1.0

    @property
    def verdict(self) -> VerdictKind:
        """Verified above 1, no gain below `MIN_GAIN`, else undecided."""
        if self.ci_low > 1.0:
            return VerdictKind.VERIFIED
        if self.ci_high < MIN_GAIN:
            return VerdictKind.NO_GAIN
        return VerdictKind.UNDECIDED

    @property
    def decided(self) -> bool:
        """Whether more rounds would add nothing to the verdict: no gain, or verified with the
        interval's lower end at least `PRECISE_SHARE` of the estimate."""
        verdict = self.verdict
        if verdict is VerdictKind.VERIFIED:
            return self.ci_low >= PRECISE_SHARE * self.speedup
        return verdict is VerdictKind.NO_GAIN

    def describe(self) -> str:
        """ "2.03x (95% CI 2.00-2.07, 12 interleaved rounds)"."""
        return (
            f"{self.speedup:.2f}x ({self.stated_level * 100:.4g}% CI {self.ci_low:.2f}-{self.ci_high:.2f}, "
            f"{self.rounds} interleaved rounds)"
        )


def look_level(look: int, alpha: float = ALPHA) -> float:
    """The interval's level at the `look`-th look (1-based): 1 - alpha * 6 / (pi^2 look^2). The
    misses sum to `alpha` over any number of looks (sum 1/k^2 = pi^2/6): 97.0%, 99.2%, 99.7%, ..."""
    if look < 1:
        raise ValueError("looks count from 1")
    return 1.0 - alpha * 6.0 / (math.pi**2 * look**2)


def paired_speedup(slow: Sequence[float], fast: Sequence[float], level: float = 0.95) -> PairedSpeedup:
    """Speedup of `fast` over `slow` from per-round paired samples, with a t interval at `level`."""
    if len(slow) != len(fast) or len(slow) < 2:
        raise ValueError("paired samples need the same number of rounds, at least 2")
    log_ratios = np.log(np.asarray(slow, dtype=float) / np.asarray(fast, dtype=float))
    mean = float(log_ratios.mean())
    half = (
        float(stats.t.ppf(0.5 + level / 2, len(log_ratios) - 1))
        * float(log_ratios.std(ddof=1))
        / math.sqrt(len(log_ratios))
    )
    return PairedSpeedup(
        speedup=math.exp(mean),
        ci_low=math.exp(mean - half),
        ci_high=math.exp(mean + half),
        rounds=len(log_ratios),
        level=level,
    )
