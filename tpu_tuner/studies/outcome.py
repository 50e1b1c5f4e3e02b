"""What became of a tuning trial, in one vocabulary for every place a user reads it.

The terminal, report.md, trials.csv (its `outcome` column) and the dashboard had each their own
words for the same trials: the terminal said "pruned" where the report said PRUNED for trials
stopped early and for failed ones alike (Optuna's state, which a failed measurement is told as, so
that TPE learns from it), and rejected settings read as measured trials. Optuna's state stays in
trials.csv's `state` column for Optuna's own tools; these words are what the product says.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from tpu_tuner.core.failures import MEASURED_AGAIN, WORKER_FAILURES, FailureKind
from tpu_tuner.studies import records


class Outcome(StrEnum):
    """A trial's outcome (stored in trials.csv: never change a value)."""

    MEASURED = "measured"  # timed to the end (feasible or not: the accuracy and memory columns say)
    STOPPED_EARLY = "stopped early"  # hopeless against the best so far, its steps cut short
    FAILED = "failed"  # the measurement failed: an error, a crash, out of memory, a timeout
    REJECTED = "rejected unmeasured"  # an agent, the clock or the memory estimate turned it away
    EXCLUDED = "excluded unmeasured"  # it held a value failure learning had excluded
    REPEAT = "repeat"  # a setting measured before: answered from that trial
    RELEASED = "released unmeasured"  # asked once the budget was spoken for
    INTERRUPTED = "interrupted"  # a lost host or a frozen process: measured again in another trial
    RUNNING = "running"  # in flight (on another worker of a shared study)
    NEVER_RUN = "never run"  # queued and never asked (a seed left when the search ended)


def outcome_of(state: str, attrs: Mapping[str, Any]) -> Outcome:
    """The outcome of a trial from its Optuna state's name and its record (`records.attrs`)."""
    kind = attrs.get(records.FAILURE_KIND)
    if state == "WAITING":
        return Outcome.NEVER_RUN
    if state == "RUNNING":
        return Outcome.RUNNING
    checks = (
        (records.REPEAT_OF in attrs, Outcome.REPEAT),
        (records.EXCLUDED_BY in attrs, Outcome.EXCLUDED),
        (records.REJECTED_BY in attrs or kind == FailureKind.WOULD_NOT_FIT, Outcome.REJECTED),
        (records.OVER_BUDGET in attrs, Outcome.RELEASED),
        # A lost worker's trial is FAIL with no kind (studies/liveness.py): measured by nobody.
        (kind in MEASURED_AGAIN or (state == "FAIL" and kind is None), Outcome.INTERRUPTED),
        (records.STOPPED_EARLY in attrs, Outcome.STOPPED_EARLY),
        # Any other kind on a trial that did not complete (a worker's, a host's "aborted"): failed.
        (kind in WORKER_FAILURES or (kind is not None and state != "COMPLETE"), Outcome.FAILED),
    )
    return next((outcome for holds, outcome in checks if holds), Outcome.MEASURED)


def tally(outcomes: list[Outcome]) -> str:
    """A run's trials counted by outcome, in words: "29 trials: 17 measured (5 stopped early),
    9 rejected unmeasured, 3 repeats"."""
    counts = {o: outcomes.count(o) for o in Outcome}
    measured = counts[Outcome.MEASURED] + counts[Outcome.STOPPED_EARLY]
    parts = [
        f"{measured} measured"
        + (f" ({counts[Outcome.STOPPED_EARLY]} stopped early)" if counts[Outcome.STOPPED_EARLY] else "")
    ]
    words = {Outcome.REPEAT: ("repeat", "repeats")}
    for outcome in Outcome:
        if outcome in (Outcome.MEASURED, Outcome.STOPPED_EARLY) or not counts[outcome]:
            continue
        one, many = words.get(outcome, (str(outcome), str(outcome)))
        parts.append(f"{counts[outcome]} {one if counts[outcome] == 1 else many}")
    total = len(outcomes)
    return f"{total} trial{'s' if total != 1 else ''}: " + ", ".join(parts)


# What tried a setting: measured to its end, stopped early, or failed while measuring.
TRIED = (Outcome.MEASURED, Outcome.STOPPED_EARLY, Outcome.FAILED)

__all__ = ["TRIED", "Outcome", "outcome_of", "tally"]
