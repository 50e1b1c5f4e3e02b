"""Which settings a study has covered, and which of them count against its budget.

One definition for every reader: the search loop (what to measure next, when the budget is
spent), the verification's hand-over between the workers of a shared study, `study status`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from tpu_tuner.core.failures import MEASURED_AGAIN
from tpu_tuner.studies.study_trial import StudyTrial

SettingKey = tuple[tuple[str, Any], ...]


def setting_key(params: Mapping[str, Any]) -> SettingKey:
    """A setting as a hashable key (its parameters, sorted)."""
    return tuple(sorted(params.items()))


def covered_settings(trials: Sequence[optuna.trial.FrozenTrial]) -> dict[SettingKey, optuna.trial.FrozenTrial]:
    """The settings a study has covered (measured, failed or rejected), each by its trial.

    Trials an interrupted run or a lost worker left behind were never measured, nor were those
    released over the budget: they neither count nor answer repeats. A repeat is answered from
    the trial it repeats."""
    covered: dict[SettingKey, optuna.trial.FrozenTrial] = {}
    for t in trials:
        if not t.state.is_finished():
            continue
        read = StudyTrial.of(t)
        if (
            not read.is_repeat
            and not read.claims.over_budget
            and read.failure_kind not in MEASURED_AGAIN
            and not read.lost
        ):
            covered[setting_key(t.params)] = t
    return covered


def measured_count(covered: dict[Any, optuna.trial.FrozenTrial]) -> int:
    """What the budget counts: settings *measured* (rejections cost nothing; repeats are answered
    from the earlier trial, so a bound on asks stops a sampler that only repeats)."""
    return sum(1 for t in covered.values() if StudyTrial.of(t).rejected_by is None)


def last_measured(trials: Sequence[optuna.trial.FrozenTrial]) -> optuna.trial.FrozenTrial | None:
    """The trial measured last (not a repeat: a repeat measures nothing), by completion time."""
    measured = [
        t
        for t in trials
        if t.datetime_complete is not None and (read := StudyTrial.of(t)).measured and not read.is_repeat
    ]
    return max(measured, key=lambda t: (t.datetime_complete, t.number)) if measured else None


__all__ = ["SettingKey", "covered_settings", "last_measured", "measured_count", "setting_key"]
