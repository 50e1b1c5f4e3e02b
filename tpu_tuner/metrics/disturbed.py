"""Disturbed rounds of an interleaved window: the rule, stated before any round is timed.

Another process taking the cores slows whatever runs at that moment; when it starts or stops
inside a round, one setting of the round is slowed and the other not, and the round's ratio is
wrong by the disturbance (issue 38's case: docs/tuning.md, "The verdict: rounds added, disturbed
rounds re-run"). A round is *disturbed* when any
setting's step in it lies more than `DISTURBED_DEVIATIONS` robust deviations above that setting's
median over the window: deviations of the log step, 1.4826 x its median absolute deviation (the
normal's sigma), never taken under `MIN_SPREAD`; so at least 1.49x the setting's median step.
Only slow steps: contention never makes a step faster. On a host whose every step wanders (a
load average of 10 on 2 cores) that spread is wide and a burst hides in it, while the paired
ratio, from which the drift cancels, stays tight: so a round is disturbed too when its
baseline/best log ratio lies more than as many robust deviations of the log ratios from their
median, either way (a burst slows whichever step it meets), the deviation never taken under
`MIN_RATIO_SPREAD` (so at least 2.2x off the median ratio) and only from `MIN_RATIO_ROUNDS`
rounds: a few genuine ratios can sit close together by chance, and trimming the next honest one
would bias the estimate. The steps' rule needs `MIN_ROUNDS` rounds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DISTURBED_DEVIATIONS = 4.0
# The least spread of log steps assumed: a window of near-identical steps would otherwise call a
# round 5% slow disturbed. 0.1 with 4 deviations: 1.49x the median.
MIN_SPREAD = 0.1
MIN_ROUNDS = 4
# The ratio's rule: at least 2.2x off the median ratio (issue 38's round was 3.2x off), from 8 rounds.
MIN_RATIO_SPREAD = 0.2
MIN_RATIO_ROUNDS = 8
MAD_TO_SIGMA = 1.4826


def disturbed_rounds(series: Sequence[Sequence[float]]) -> list[int]:
    """Indices of the disturbed rounds (the module's rule); `series` holds each compared setting's
    step of every round, in round order, the baseline first and the best second."""
    flagged: set[int] = set()
    if not series or len(series[0]) < MIN_ROUNDS:
        return []
    logs = [np.log(np.asarray(steps, dtype=float)) for steps in series]
    for log_steps in logs:
        flagged.update(int(i) for i in np.nonzero(_deviations(log_steps, MIN_SPREAD) > DISTURBED_DEVIATIONS)[0])
    if len(logs) > 1 and len(logs[0]) >= MIN_RATIO_ROUNDS:
        ratio_deviations = np.abs(_deviations(logs[0] - logs[1], MIN_RATIO_SPREAD))
        flagged.update(int(i) for i in np.nonzero(ratio_deviations > DISTURBED_DEVIATIONS)[0])
    return sorted(flagged)


def _deviations(values: np.ndarray, least_spread: float) -> np.ndarray:
    """Each value's distance above the median in robust deviations (negative below it)."""
    median = float(np.median(values))
    spread = max(MAD_TO_SIGMA * float(np.median(np.abs(values - median))), least_spread)
    return (values - median) / spread
