"""Unsteady settings of an interleaved window: rounds in two clusters, or drifting, judged per setting.

The paired estimate assumes each setting's rounds are draws from one steady distribution; the
two ways issue 55 saw they were not, neither a slow outlier round (metrics/disturbed.py):
docs/tuning.md, "Unsteady settings". The rules, stated before any round is timed, judge the log
steps of each setting and the baseline/best log ratio, all rounds:

* **bimodal**: sorted, the values split at their widest gap into two clusters of at least
  `MIN_CLUSTER` rounds (and `MIN_CLUSTER_SHARE` of them), the gap at least `GAP_SPREADS` times
  the pooled within-cluster standard deviation and at least `MIN_GAP` (10%). A lone slow round
  is no cluster (the disturbed rule deals with it); normal noise, whose widest gap is about one
  standard deviation, rarely comes near.
* **drifting**: the Theil-Sen slope of the values over the round number (robust: a disturbed
  round does not make a trend), its interval at `DRIFT_LEVEL` excluding 0, and the change it
  implies over the window at least `MIN_DRIFT` (5%).

Each needs `MIN_JUDGED_ROUNDS` rounds. A flag does not change the verdict's interval: the window
adds rounds for it once when the clock allows (tuning/verify/verify_window.py) and says what it found.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from tpu_tuner.core.units import duration

MIN_JUDGED_ROUNDS = 8
MIN_CLUSTER = 3
MIN_CLUSTER_SHARE = 1 / 6
# 6 pooled deviations: normal (or t3) rounds reached it in about 2 windows of 1000 at 8 rounds and
# fewer beyond when the rule was set (20,000 seeded windows; tests/test_verify_window.py checks a
# bound); the bimodal step is over 20 deviations apart.
GAP_SPREADS = 6.0
MIN_GAP = math.log(1.10)
# At 99% with the 5% floor, steady rounds of log-sd 0.03-0.1 are called drifting in under 1 window
# of 100; the issue's 8.65x -> 6.52x over 12 rounds is found at log-sd 0.03 (the tests' figures).
DRIFT_LEVEL = 0.99
MIN_DRIFT = math.log(1.05)
BIMODAL = "bimodal"
DRIFTING = "drifting"


@dataclass(frozen=True)
class Unsteady:
    """One setting (or the ratio) judged unsteady: `label` names it ("best", "ratio"), `kind` is
    `BIMODAL` or `DRIFTING`, `detail` says what was seen, in words."""

    label: str
    kind: str
    detail: str

    def describe(self) -> str:
        return f"{self.label} {self.kind} ({self.detail})"


def bimodal(values: Sequence[float]) -> tuple[int, float, float] | None:
    """Where the log values `values` (one per round) fall in two clusters by the module's rule:
    (rounds in the low cluster, the low and the high clusters' medians, exponentiated); else None."""
    v = np.sort(np.asarray(values, dtype=float))
    n = len(v)
    least = max(MIN_CLUSTER, math.ceil(MIN_CLUSTER_SHARE * n))
    if n < MIN_JUDGED_ROUNDS or n < 2 * least:
        return None
    gaps = np.diff(v)[least - 1 : n - least]  # splits leaving `least` values on each side
    k = int(np.argmax(gaps)) + least  # the low cluster is v[:k]
    gap = float(v[k] - v[k - 1])
    low, high = v[:k], v[k:]
    within = math.sqrt((float(np.sum((low - low.mean()) ** 2)) + float(np.sum((high - high.mean()) ** 2))) / (n - 2))
    if gap < MIN_GAP or gap < GAP_SPREADS * within:
        return None
    return k, math.exp(float(np.median(low))), math.exp(float(np.median(high)))


def drift(values: Sequence[float], rounds: Sequence[int]) -> tuple[float, float] | None:
    """The fitted line's values (exponentiated) at the first and the last of `rounds` (round
    numbers) for the log values `values`, where they drift by the module's rule; else None."""
    y, x = np.asarray(values, dtype=float), np.asarray(rounds, dtype=float)
    if len(y) < MIN_JUDGED_ROUNDS or np.ptp(x) == 0:
        return None
    slope, intercept, low, high = stats.theilslopes(y, x, alpha=DRIFT_LEVEL)
    if low <= 0.0 <= high or abs(float(slope)) * float(np.ptp(x)) < MIN_DRIFT:
        return None
    return math.exp(intercept + slope * float(x.min())), math.exp(intercept + slope * float(x.max()))


def unsteady_settings(series: Sequence[Sequence[float]], labels: Sequence[str]) -> list[Unsteady]:
    """Each setting of `series` (its step each round, in round order; the baseline first, the best
    second, named by `labels`) and their ratio judged by the module's rules: the unsteady ones."""
    found: list[Unsteady] = []
    if not series or len(series[0]) < MIN_JUDGED_ROUNDS:
        return found
    logs = [np.log(np.asarray(steps, dtype=float)) for steps in series]
    judged = list(zip(labels, logs, [False] * len(logs)))
    if len(logs) > 1:
        judged.append((f"{labels[0]}/{labels[1]} ratio", logs[0] - logs[1], True))
    rounds = list(range(len(logs[0])))
    for label, values, is_ratio in judged:
        unit = (lambda x: f"{x:.2f}x") if is_ratio else duration
        split = bimodal(values)
        if split is not None:
            k, low, high = split
            found.append(Unsteady(label, BIMODAL, f"{k} rounds near {unit(low)}, {len(values) - k} near {unit(high)}"))
        line = drift(values, rounds)
        if line is not None:
            start, end = line
            found.append(
                Unsteady(
                    label, DRIFTING, f"{unit(start)} to {unit(end)} over {len(values)} rounds, {end / start - 1:+.0%}"
                )
            )
    return found


__all__ = ["BIMODAL", "DRIFTING", "Unsteady", "bimodal", "drift", "unsteady_settings"]
