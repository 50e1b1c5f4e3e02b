"""A tuning trial read once: its stored record (studies/records.py) as a frozen, typed value.

A trial's results live in one Optuna user attribute, a dict of string keys that every version of
tpu-tune has written in its own layout (`records.attrs` reads them all). `TuningTrial.of` is the
one place a tuning trial's keys are read, on the study layer's record of the same trial
(studies/study_trial.py: claims, failure, rejection): the measurement is parsed once, the figures
typed, and readers take the record instead of turning the dict into their own figures again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Self

from optuna.trial import FrozenTrial, TrialState

from tpu_tuner.core.failures import WORKER_FAILURES
from tpu_tuner.execution.measurement import EarlyStop, Measurement
from tpu_tuner.studies import records
from tpu_tuner.studies.outcome import Outcome, outcome_of
from tpu_tuner.studies.study_trial import Claims, Failure, StudyTrial
from tpu_tuner.studies.trial_costs import COST_KEYS


@dataclass(frozen=True)
class WallTimeSplit:
    """Where a measured trial's wall time went: after it, `COST_KEYS`' figures in their order
    (studies/trial_costs.py); None where not stored."""

    wall_s: float | None = None
    worker_start_s: float | None = None
    steps_s: float | None = None
    overhead_s: float | None = None
    reference_s: float | None = None
    estimate_s: float | None = None
    build_s: float | None = None
    judge_s: float | None = None


@dataclass(frozen=True)
class TuningTrial(StudyTrial):
    """One tuning trial as its record says (built by `of`): the study layer's record, then a tuning
    trial's own keys."""

    outcome: Outcome
    measurement: Measurement | None  # None for failed, rejected and repeated trials
    candidate: dict[str, Any] | None
    probe_for: dict[str, Any] | None  # a probe queued by failure learning: what it tests
    early_stop: EarlyStop | None
    stopped_early: str | None  # the early stop's message
    costs: WallTimeSplit
    feasible: bool  # the record's word (accuracy and memory), whatever the trial's state
    step_median_s: float | None
    compile_s: float | None
    mfu: float | None
    peak_memory_bytes: int | None
    memory_limit_bytes: int | None
    # What the guardrail judged: its error against fp32 beyond the baseline's; a record without
    # baseline figures (older versions) its error against fp32; None without an accuracy figure.
    accuracy_excess: float | None
    start_env: tuple[str, ...]
    buckets: tuple[int, ...] | None  # with varying input lengths: the trial's best bucketing
    padding_waste: float | None

    @classmethod
    def of(cls, trial: FrozenTrial) -> Self:
        """The record of `trial`, from a study of any version (`records.attrs`)."""
        study = StudyTrial.of(trial)  # the study layer's keys, read once; this record's from its `stored`
        a = study.stored
        raw = a.get(records.MEASUREMENT)
        excess = a.get(records.ACCURACY_EXCESS)
        error = a.get(records.ACCURACY_ERROR) if excess is None else excess
        buckets = a.get(records.BUCKETS)
        return cls(
            **vars(study),
            outcome=outcome_of(trial.state.name, a),
            measurement=Measurement(**json.loads(raw)) if raw else None,
            candidate=a.get(records.CANDIDATE),
            probe_for=probe if isinstance(probe := a.get(records.PROBE_FOR), dict) else None,
            early_stop=_early_stop(a.get(records.EARLY_STOP)),
            stopped_early=a.get(records.STOPPED_EARLY),
            costs=WallTimeSplit(
                _float(a.get(records.TRIAL_WALL_S)),
                *(_float(a.get(key)) for key in COST_KEYS),
            ),
            feasible=bool(a.get(records.FEASIBLE)),
            step_median_s=_float(a.get(records.STEP_MEDIAN_S)),
            compile_s=_float(a.get(records.COMPILE_S)),
            mfu=_float(a.get(records.MFU)),
            peak_memory_bytes=a.get(records.PEAK_MEMORY_BYTES),
            memory_limit_bytes=a.get(records.MEMORY_LIMIT_BYTES),
            accuracy_excess=_float(error),
            start_env=tuple(a.get(records.START_ENV) or ()),
            buckets=tuple(buckets) if buckets is not None else None,
            padding_waste=a.get(records.PADDING_WASTE),
        )

    @property
    def is_feasible(self) -> bool:
        """Whether the trial completed and its record says feasible (accuracy and memory)."""
        return self.state == TrialState.COMPLETE and self.feasible

    @property
    def objective(self) -> float:
        """The objective value of a complete trial (a feasible one always has it), in seconds."""
        if self.value is None:
            raise ValueError(f"trial {self.number} has no objective value (state {self.state.name})")
        return self.value

    @property
    def measured_by(self) -> int:
        """The number of the trial that measured this one's setting: the one it repeats, else itself."""
        return self.number if self.claims.repeat_of is None else self.claims.repeat_of

    @property
    def failed_to_run(self) -> bool:
        """Whether the measurement failed in the worker (an error, crash, out-of-memory or timeout):
        told as FAIL by earlier versions, as PRUNED with a failure kind now."""
        failure = self.failure
        return (
            self.state != TrialState.COMPLETE
            and failure is not None
            and failure.kind in WORKER_FAILURES
            and not self.is_repeat
        )

    @property
    def finished(self) -> bool:
        """Whether the trial is told: a finished trial's record no longer changes."""
        return self.state.is_finished()


def measured_peaks(trials: Sequence[TuningTrial], settings: Sequence[Mapping[str, Any]]) -> list[int | None]:
    """The peak memory the search measured for each of `settings`: what a comparison needs to know
    of steps kept side by side (tuning/run/clock.py, `resident_groups`)."""
    return _measured(trials, settings, lambda t: t.peak_memory_bytes)


def measured_steps(trials: Sequence[TuningTrial], settings: Sequence[Mapping[str, Any]]) -> list[float | None]:
    """The median step the search measured for each of `settings` (tuning/verify/search_agreement.py)."""
    return _measured(trials, settings, lambda t: t.step_median_s)


def _measured(
    trials: Sequence[TuningTrial], settings: Sequence[Mapping[str, Any]], figure: Callable[[TuningTrial], Any]
) -> list[Any]:
    """The `figure` of each of `settings` (a trial's params) from the search's trials (the last one
    of those params that has it), None where none ran it or it has no such figure."""
    found: dict[str, Any] = {}
    for trial in trials:
        if value := figure(trial):
            found[json.dumps(trial.params, sort_keys=True)] = value
    return [found.get(json.dumps(dict(params), sort_keys=True)) for params in settings]


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _early_stop(data: Any) -> EarlyStop | None:
    """The stored `EarlyStop` (its dict); a record of an earlier layout that does not build one
    reads as None rather than failing the whole study's reading."""
    if not isinstance(data, Mapping):
        return None
    known = {f.name for f in fields(EarlyStop)}
    try:
        return EarlyStop(**{key: value for key, value in data.items() if key in known})
    except TypeError:
        return None


__all__ = ["Claims", "Failure", "WallTimeSplit", "TuningTrial", "measured_peaks", "measured_steps"]
