"""Stopping hopeless trials: the tuner's Optuna pruner.

A trial whose first steps already put it beyond `PRUNE_FACTOR` times the best feasible objective
so far (its fastest step, plus the compile it spent, spread over the planned steps: noise only
slows a step, so this is optimistic) cannot become the best, and its remaining steps would only
spend the user's time. The trial worker applies the rule to its steps as they come
(execution/early_stop.py: `MeasureRequest.stop_above_s` is this pruner's threshold); the parent
reports what the worker measured (`trial.report`) and asks the study's pruner (`should_prune`),
as any Optuna pruner is asked. A compile that alone would cost more than the threshold over the
planned steps is cut off the same way. 1.5x: the spread of one trial's median on a shared host
(docs/search-efficiency.md) is far below it, so a setting near the best is never stopped.
"""

from __future__ import annotations

from collections.abc import Sequence

import optuna
from optuna.trial import FrozenTrial

from tpu_tuner.tuning.search.tuning_trial import TuningTrial

PRUNE_FACTOR = 1.5


def best_objective(trials: Sequence[TuningTrial]) -> float | None:
    """The best feasible objective among `trials`, or None before any."""
    values = [t.value for t in trials if t.is_feasible and t.value is not None]
    return min(values) if values else None


class HopelessPruner(optuna.pruners.BasePruner):
    """Prune a trial whose last reported value (an optimistic amortised step) exceeds
    `factor` times the study's best feasible objective."""

    def __init__(self, factor: float = PRUNE_FACTOR) -> None:
        self.factor = factor

    def threshold(self, trials: Sequence[TuningTrial]) -> float | None:
        """The objective beyond which a trial is hopeless, given the study's `trials`."""
        best = best_objective(trials)
        return None if best is None else best * self.factor

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        if not trial.intermediate_values:
            return False
        limit = self.threshold(TuningTrial.all(study.get_trials(deepcopy=False)))
        _, last = max(trial.intermediate_values.items())
        return limit is not None and last > limit


__all__ = ["PRUNE_FACTOR", "HopelessPruner", "best_objective"]
