"""What a run's trials cost beyond what they measure: settings measured per minute of trial time
and each measured trial's cost beyond its compile and timed steps (its worker's start-up and the
rest), read from the trials' table (trials.csv's columns), for report.md and the TPU benchmark.

On a TPU v5e chip a trial's worker start alone was about 15 s, so this is the figure that says
whether a run's time went into measuring or around it (issue 56).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from tpu_tuner.studies import records
from tpu_tuner.studies.trial_costs import BUILD_S, ESTIMATE_S, JUDGE_S, OVERHEAD_S, REFERENCE_S, STEPS_S, WORKER_START_S

# The overhead's parts a worker tells apart, as report.md names them.
PHASE_WORDS = {ESTIMATE_S: "memory estimate", BUILD_S: "build", JUDGE_S: "accuracy check"}


@dataclass(frozen=True)
class TrialCosts:
    """`measured` trials (measured to the end or stopped early) in `trial_minutes` of trials'
    wall time (every trial that ran a job: failed ones cost time too); the median of their cost
    beyond compile and timed steps (worker start + overhead), None without one."""

    measured: int
    trial_minutes: float
    beyond_median_s: float | None
    reference_s: float = 0.0  # in all, the fp32 reference's and the baseline's outputs (once a worker)
    phase_medians_s: dict[str, float] = field(default_factory=dict)  # `PHASE_WORDS`' keys, where recorded

    @property
    def per_minute(self) -> float | None:
        """Settings measured per minute of trials; None where no trial ran."""
        return self.measured / self.trial_minutes if self.trial_minutes > 0 else None


def trial_costs(frame: Any) -> TrialCosts:
    """The costs of the trials in `frame` (a trials table: `tuning.trials_table.trials_frame`, or
    trials.csv read back); a table without the cost columns (an older run) counts no measured one."""
    walls = _numbers(frame, records.TRIAL_WALL_S)
    steps = _numbers(frame, STEPS_S)
    starts, overheads = _numbers(frame, WORKER_START_S), _numbers(frame, OVERHEAD_S)
    # A start not told apart (None) is already in the overhead.
    beyond = [
        (start or 0.0) + overhead
        for start, overhead, step in zip(starts, overheads, steps, strict=True)
        if overhead is not None and step is not None
    ]
    return TrialCosts(
        measured=sum(s is not None for s in steps),
        trial_minutes=sum(w for w in walls if w is not None) / 60,
        beyond_median_s=statistics.median(beyond) if beyond else None,
        reference_s=sum(r for r in _numbers(frame, REFERENCE_S) if r is not None),
        phase_medians_s={
            key: statistics.median(values)
            for key in PHASE_WORDS
            if (values := [v for v in _numbers(frame, key) if v is not None])
        },
    )


def cost_line(frame: Any, worker_starts: int) -> str:
    """report.md's line: "settings measured per minute: X; per-trial cost beyond compile and timed
    steps: median Y s (worker starts: N)"."""
    costs = trial_costs(frame)
    rate = "n/a" if costs.per_minute is None else f"{costs.per_minute:.1f}"
    beyond = "n/a" if costs.beyond_median_s is None else f"median {costs.beyond_median_s:.1f} s"
    if costs.reference_s > 0:
        beyond += f", {costs.reference_s:.1f} s of it in all computing the fp32 reference's and the baseline's outputs"
    if costs.phase_medians_s:
        beyond += "; of it, medians: " + ", ".join(
            f"{PHASE_WORDS[key]} {seconds:.1f} s" for key, seconds in costs.phase_medians_s.items()
        )
    return (
        f"- Settings measured per minute: {rate} ({costs.measured} in {costs.trial_minutes:.1f} min of trials); "
        f"per-trial cost beyond compile and timed steps: {beyond} (worker starts: {worker_starts})."
    )


def _numbers(frame: Any, column: str) -> list[float | None]:
    """`column`'s values as floats, None where missing (NaN) or where the table has no such column."""
    if column not in frame:
        return [None] * len(frame)
    return [None if value is None or value != value else float(value) for value in frame[column]]


__all__ = ["TrialCosts", "cost_line", "trial_costs"]
