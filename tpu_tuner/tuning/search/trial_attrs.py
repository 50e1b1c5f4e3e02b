"""What a trial stores in the Optuna storage, so results rebuild from the study alone.

A trial's keys go into its record (studies/trial_record.py) and are stored together, once, just
before it is told: one storage call for the whole measurement instead of one per key. Readers
take the trial's record, `TuningTrial.of` (tuning_trial.py), which reads a study of any version.
"""

from __future__ import annotations

import json
from typing import Any

import optuna

from tpu_tuner.core.failures import FailureKind
from tpu_tuner.execution.measurement import AccuracyFigures, EarlyStop, Measurement, TrialFailure, accuracy_refusal
from tpu_tuner.studies import records
from tpu_tuner.studies.trial_costs import COST_KEYS
from tpu_tuner.studies.trial_record import TrialRecord
from tpu_tuner.tuning.search.bucketing_context import BucketingContext
from tpu_tuner.tuning.search.memory_limit import MemoryLimit
from tpu_tuner.tuning.search.tuning_trial import TuningTrial

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
    accuracy constraint (at most `tolerance` less accurate than the baseline: `AccuracyFigures`)
    and (with a `memory` limit) the memory constraint; return the objective
    value: the amortised step, or with varying input lengths the expected step under the trial's
    best bucketing (see tuning/search/bucketing_context.py)."""
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
            **_accuracy_keys(m),
            records.PEAK_MEMORY_BYTES: m.peak_memory_bytes,
            **({records.MEMORY_LIMIT_BYTES: memory.bytes} if memory is not None else {}),
            records.ESTIMATED_PEAK_BYTES: m.estimated_peak_bytes,
            records.ESTIMATE_ERROR: m.estimate_error,
            **({records.ESTIMATE_NOTE: m.estimate_note} if m.estimate_note else {}),
            records.FEASIBLE: not m.accuracy_refused(tolerance),
            records.CANDIDATE: m.candidate,
        }
    )
    if m.accuracy_refused(tolerance):
        record.update(_accuracy_failure(m, tolerance))
    over = memory.exceeded_by(m.peak_memory_bytes) if memory is not None and m.peak_memory_bytes is not None else None
    if over:
        record.set(records.FEASIBLE, False)
        if not m.accuracy_refused(tolerance):  # the accuracy reason, where both fail, stays first
            record.update({records.FAILURE_KIND: FailureKind.MEMORY, records.FAILURE_MESSAGE: over})
    record.flush()
    # Optuna: a trial is feasible when every constraint is <= 0.
    trial.set_constraint("accuracy", m.accuracy_excess - tolerance)
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
        record.update(_accuracy_keys(stop))
        if stop.accuracy_refused(tolerance):
            record.update(_accuracy_failure(stop, tolerance))
    record.flush()


def _accuracy_keys(figures: AccuracyFigures) -> dict[str, Any]:
    """A trial's accuracy figures as record keys: its error against fp32, and (where the worker had
    the baseline's outputs) the baseline's against fp32, its own against the baseline's, and the
    excess over the baseline's error that the guardrail judges."""
    keys: dict[str, Any] = {records.ACCURACY_ERROR: figures.accuracy_error}
    if figures.baseline_errors:
        keys.update(
            {
                records.BASELINE_ACCURACY_ERROR: figures.baseline_error,
                records.ACCURACY_ERROR_VS_BASELINE: figures.error_vs_baseline,
                records.ACCURACY_EXCESS: figures.accuracy_excess,
            }
        )
    return keys


def _accuracy_failure(figures: AccuracyFigures, tolerance: float) -> dict[str, Any]:
    """The failure keys of a setting more than the tolerance less accurate than the baseline."""
    message = accuracy_refusal(figures.accuracy_errors, figures.baseline_errors, tolerance)
    return {records.FAILURE_KIND: FailureKind.ACCURACY, records.FAILURE_MESSAGE: message}


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
    *COST_KEYS,
    records.WARM_START,
)


def copy_attrs(source: optuna.trial.FrozenTrial, target: optuna.Trial, tolerance: float) -> None:
    """Make a repeated parameter set carry its first measurement's figures (one record write)."""
    read = TuningTrial.of(source)
    record = TrialRecord.of(target)
    # The keys pass on as stored (any version's, those this one no longer names too).
    record.update({key: value for key, value in read.stored.items() if key not in NOT_COPIED})
    record.write({records.REPEAT_OF: source.number})
    excess = read.accuracy_excess
    if excess is not None:
        target.set_constraint("accuracy", excess - tolerance)
    if "memory" in source.constraints:
        target.set_constraint("memory", source.constraints["memory"])
