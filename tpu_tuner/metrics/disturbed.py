"""Disturbed rounds of an interleaved window: the rule, stated before any round is timed.

Another process taking the cores slows whatever runs at that moment; when it starts or stops
inside a round, one setting of the round is slowed and the other not, and the round's ratio is
wrong by the disturbance (issue 38: one round at 0.62x among rounds at 1.7-2.4x took a
vision transformer's interval from about 2.0x down to 1.00-2.45). A round is *disturbed* when any
setting's step in it lies more than `DISTURBED_DEVIATIONS` robust deviations above that setting's
median over the window: deviations of the log step, 1.4826 x its median absolute deviation (the
normal's sigma), never taken under `MIN_SPREAD`; so at least 1.49x the setting's median step.
Only slow steps: contention never makes a step faster. The rule needs `MIN_ROUNDS` rounds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DISTURBED_DEVIATIONS = 4.0
# The least spread of log steps assumed: a window of near-identical steps would otherwise call a
# round 5% slow disturbed. 0.1 with 4 deviations: 1.49x the median.
MIN_SPREAD = 0.1
MIN_ROUNDS = 4
MAD_TO_SIGMA = 1.4826


def disturbed_rounds(series: Sequence[Sequence[float]]) -> list[int]:
    """Indices of the rounds in which any series' step is disturbed (the module's rule); `series`
    holds each compared setting's step of every round, in round order."""
    flagged: set[int] = set()
    for steps in series:
        if len(steps) < MIN_ROUNDS:
            continue
        logs = np.log(np.asarray(steps, dtype=float))
        median = float(np.median(logs))
        spread = max(MAD_TO_SIGMA * float(np.median(np.abs(logs - median))), MIN_SPREAD)
        flagged.update(int(i) for i in np.nonzero(logs - median > DISTURBED_DEVIATIONS * spread)[0])
    return sorted(flagged)
