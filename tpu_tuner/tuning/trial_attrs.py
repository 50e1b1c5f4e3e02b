"""What a trial stores in the Optuna storage, so results rebuild from the study alone.

A trial's keys go into its record (studies/trial_record.py) and are stored together, once, just
before it is told: one storage call for the whole measurement instead of one per key. Readers
go through `records.attrs`, which reads a study of any version.
"""

from __future__ import annotations

import json
from typing import Any

import optuna

from tpu_tuner.core.failures import WORKER_FAILURES, FailureKind
from tpu_tuner.execution.measurement import EarlyStop, Measurement, TrialFailure
from tpu_tuner.studies import records
from tpu_tuner.studies.trial_record import TrialRecord
from tpu_tuner.tuning.bucketing import BucketingContext
from tpu_tuner.tuning.memory_limit import MemoryLimit

MAX_STORED_SAMPLES = 200


def record_claim(trial: optuna.Trial, worker: str, host: str) -> None:
    """Store who runs `trial` and where, as soon as it is asked: other workers read it while it
    runs (the dashboard's hosts, `study status`)."""
    TrialRecord.of(trial).write({records.WORKER: worker, records.HOST: host})


def record_measurement(
    trial: optuna.Trial,
    m: Measurement,
    planned_steps: int,
    tolerance: float,
    bucketing: BucketingContext | None = None,
    memory: MemoryLimit | None = None,
) -> float:
    """Store the measurement (with any keys already set on the trial's record, in one write), the
    accuracy constraint and (with a `memory` limit) the memory constraint; return the objective
    value: the amortised step, or with varying input lengths the expected step under the trial's
    best bucketing (see tuning/bucketing.py)."""
    record = TrialRecord.of(trial)
    objective = m.amortised_step(planned_steps)
    if bucketing is not None:
        best = bucketing.best(m.step_median, m.compile_seconds, planned_steps)
        objective = best.total_seconds / planned_steps
        record.update({records.BUCKETS: list(best.strategy.bounds), records.PADDING_WASTE: best.padding_waste})
    data = m.to_dict()
    data["samples"] = data["samples"][:MAX_STORED_SAMPLES]
    record.update(
        {
            records.MEASUREMENT: json.dumps(data),
            records.STEP_MEDIAN_S: m.step_median,
            records.COMPILE_S: m.compile_seconds,
            records.AMORTISED_STEP_S: objective,
            records.MFU: m.mfu,
            records.ACCURACY_ERROR: m.accuracy_error,
            records.PEAK_MEMORY_BYTES: m.peak_memory_bytes,
            records.ESTIMATED_PEAK_BYTES: m.estimated_peak_bytes,
            records.ESTIMATE_ERROR: m.estimate_error,
            **({records.ESTIMATE_NOTE: m.estimate_note} if m.estimate_note else {}),
            records.FEASIBLE: m.accuracy_error <= tolerance,
            records.CANDIDATE: m.candidate,
        }
    )
    if m.accuracy_error > tolerance:
        record.update(_accuracy_failure(m.accuracy_error, tolerance))
    over = memory.exceeded_by(m.peak_memory_bytes) if memory is not None and m.peak_memory_bytes is not None else None
    if over:
        record.set(records.FEASIBLE, False)
        if m.accuracy_error <= tolerance:  # the accuracy reason, where both fail, stays first
            record.update({records.FAILURE_KIND: FailureKind.MEMORY, records.FAILURE_MESSAGE: over})
    record.flush()
    # Optuna: a trial is feasible when every constraint is <= 0.
    trial.set_constraint("accuracy", m.accuracy_error - tolerance)
    if memory is not None and m.peak_memory_bytes is not None:
        trial.set_constraint("memory", float(m.peak_memory_bytes - memory.bytes))
    return objective


def record_failure(trial: optuna.Trial, failure: TrialFailure) -> None:
    """Store how a measured trial failed (with any keys already set on its record, in one write)."""
    TrialRecord.of(trial).write(
        {records.FAILURE_KIND: failure.kind, records.FAILURE_MESSAGE: failure.message, records.FEASIBLE: False}
    )


def record_early_stop(trial: optuna.Trial, stop: EarlyStop, tolerance: float) -> None:
    """Store what a trial stopped early measured (`EarlyStop`): why, its steps, and its accuracy
    where the first call was compared; it is no setting to choose (infeasible)."""
    data = stop.to_dict()
    data["steps"] = data["steps"][:MAX_STORED_SAMPLES]
    record = TrialRecord.of(trial)
    record.update(
        {
            records.STOPPED_EARLY: stop.message,
            records.EARLY_STOP: data,
            records.CANDIDATE: stop.candidate,
            records.FEASIBLE: False,
            records.COMPILE_S: stop.compile_seconds,
        }
    )
    if stop.accuracy_errors:
        error = max(stop.accuracy_errors.values())
        record.set(records.ACCURACY_ERROR, error)
        if error > tolerance:
            record.update(_accuracy_failure(error, tolerance))
    record.flush()


def _accuracy_failure(error: float, tolerance: float) -> dict[str, Any]:
    """The failure keys of an accuracy error over the tolerance."""
    message = f"accuracy error {error:.3g} > tolerance {tolerance:g}"
    return {records.FAILURE_KIND: FailureKind.ACCURACY, records.FAILURE_MESSAGE: message}


def failed_to_run(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether a trial's measurement failed in the worker (an error, crash, out-of-memory or
    timeout): told as FAIL by earlier versions, as PRUNED with a failure kind now."""
    return (
        trial.state != optuna.trial.TrialState.COMPLETE
        and records.attrs(trial).get(records.FAILURE_KIND) in WORKER_FAILURES
        and records.REPEAT_OF not in records.attrs(trial)
    )


def measurement_of(trial: optuna.trial.FrozenTrial) -> Measurement | None:
    """The measurement a trial stored, or None for failed, rejected and repeated trials."""
    raw = records.attrs(trial).get(records.MEASUREMENT)
    return Measurement(**json.loads(raw)) if raw else None


def is_feasible(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether `trial` completed and its record says feasible (accuracy and memory)."""
    return trial.state == optuna.trial.TrialState.COMPLETE and bool(records.attrs(trial).get(records.FEASIBLE))


def objective(trial: optuna.trial.FrozenTrial) -> float:
    """The objective value of a complete trial (a feasible one always has it), in seconds."""
    if trial.value is None:
        raise ValueError(f"trial {trial.number} has no objective value (state {trial.state.name})")
    return trial.value


# What a repeat does not take from the trial it repeats: the measurement itself, and what says
# who ran the trial and where (a repeat is answered by the worker that asked for it, measuring
# nothing: it must not pass for the earlier worker's measured trial), or how it was queued.
NOT_COPIED = (
    records.MEASUREMENT,
    records.MEASURED,
    records.WORKER,
    records.HOST,
    records.HOSTS,
    records.TRIAL_WALL_S,
    records.WARM_START,
)


def copy_attrs(source: optuna.trial.FrozenTrial, target: optuna.Trial, tolerance: float) -> None:
    """Make a repeated parameter set carry its first measurement's figures (one record write)."""
    attrs = records.attrs(source)
    record = TrialRecord.of(target)
    record.update({key: value for key, value in attrs.items() if key not in NOT_COPIED})
    record.write({records.REPEAT_OF: source.number})
    error = attrs.get(records.ACCURACY_ERROR)
    if error is not None:
        target.set_constraint("accuracy", float(error) - tolerance)
    if "memory" in source.constraints:
        target.set_constraint("memory", source.constraints["memory"])
