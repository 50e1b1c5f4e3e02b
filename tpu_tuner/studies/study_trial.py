"""A trial of any study read once: the study layer's own keys of its record, typed and frozen.

The loop, liveness and coverage ask the same few things of a trial of either feature: who
claimed it, whether the loop settled it without a measurement (a repeat, one released over the
budget), whether it failed and how, whether it was turned away. `StudyTrial.of` reads them from
the stored record (`records.attrs`, any layout) in one place; the features' records
(tuning/search/tuning_trial.py, planner/plans/plan_trial.py) are built on it rather than reading
these keys again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, Self

from optuna.trial import FrozenTrial, TrialState

from tpu_tuner.studies import records


@dataclass(frozen=True)
class Failure:
    """How a trial ended when it measured nothing useful: its kind (a `FailureKind` value, as
    stored) and the message."""

    kind: str
    message: str | None


@dataclass(frozen=True)
class Claims:
    """Who ran a trial and where, and what the loop said of it: a repeat of an earlier trial (one
    in flight on another worker too), or released unmeasured over the budget."""

    worker: str | None = None
    host: str | None = None
    hosts: tuple[str, ...] = ()
    repeat_of: int | None = None
    in_flight_elsewhere: bool = False
    over_budget: bool = False


@dataclass(frozen=True)
class StudyTrial:
    """One trial as the study layer reads it (built by `of`): Optuna's fields, then the record's.
    A feature's record (`TuningTrial`, `PlanTrial`) extends it with its own keys, read in its `of`."""

    number: int
    state: TrialState
    params: dict[str, Any]
    value: float | None
    # When it was told: not part of equality, as `stored`: the same search run twice, or one trial
    # stored by two versions, reads as the same records (compare_records.py drops it likewise).
    datetime_complete: datetime | None = field(compare=False)
    claims: Claims
    failure: Failure | None
    rejected_by: str | None
    excluded_by: str | None
    measured: bool  # the loop's flag: the trial was asked to measure (not answered otherwise)
    warm_start: dict[str, Any] | None  # how its setting was queued from an earlier study
    # Every key as stored (any layout, flattened), for what passes them on verbatim: a feature's
    # record built on this one, trials.csv's columns, a repeat's copy. Not part of equality: the
    # same trial stored by two versions holds different keys and reads as the same record.
    stored: Mapping[str, Any] = field(compare=False, repr=False)

    @classmethod
    def of(cls, trial: FrozenTrial) -> Self:
        """The record of `trial`, from a study of any version: the one reader of the attribute dict."""
        a = MappingProxyType(dict(records.attrs(trial)))
        kind, repeat_of, warm = a.get(records.FAILURE_KIND), a.get(records.REPEAT_OF), a.get(records.WARM_START)
        return cls(
            number=trial.number,
            state=trial.state,
            params=dict(trial.params),
            value=trial.value,
            datetime_complete=trial.datetime_complete,
            claims=Claims(
                a.get(records.WORKER),
                a.get(records.HOST),
                tuple(a.get(records.HOSTS) or ()),
                None if repeat_of is None else int(repeat_of),
                bool(a.get(records.IN_FLIGHT_ELSEWHERE)),
                bool(a.get(records.OVER_BUDGET)),
            ),
            failure=None if kind is None else Failure(str(kind), a.get(records.FAILURE_MESSAGE)),
            rejected_by=a.get(records.REJECTED_BY),
            excluded_by=a.get(records.EXCLUDED_BY),
            measured=bool(a.get(records.MEASURED)),
            warm_start=warm if isinstance(warm, dict) else None,
            stored=a,
        )

    @classmethod
    def all(cls, trials: Iterable[FrozenTrial]) -> list[Self]:
        """The records of `trials`, in order."""
        return [cls.of(trial) for trial in trials]

    @property
    def failure_kind(self) -> str | None:
        """The failure's kind, None where the trial recorded no failure."""
        return None if self.failure is None else self.failure.kind

    @property
    def is_repeat(self) -> bool:
        """Whether the trial was answered from an earlier one's result (it measured nothing)."""
        return self.claims.repeat_of is not None

    @property
    def lost(self) -> bool:
        """Whether the trial was failed because its worker was lost. Every failure a worker records
        names its kind ("interrupted" on resume); a lost worker records none, even when it died
        halfway through recording a measurement (studies/liveness.py)."""
        return self.state == TrialState.FAIL and self.failure is None


__all__ = ["Claims", "Failure", "StudyTrial"]
