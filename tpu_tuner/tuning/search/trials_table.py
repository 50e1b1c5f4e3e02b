"""trials.csv: one row per trial of a tuning run, in the columns and words every output reads.

report.md's trials table, the plots and the dashboard all read this frame, so a trial has one
number (Optuna's, as the failure learner's "excluded after trial N" says it) and one outcome
(`studies/outcome.py`) wherever a user meets it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import optuna
import pandas as pd

from tpu_tuner.execution.measurement import Measurement
from tpu_tuner.knobs import registry as knobs
from tpu_tuner.studies import records
from tpu_tuner.studies.outcome import Outcome
from tpu_tuner.studies.trial_costs import COST_KEYS
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.search.tuning_trial import TuningTrial

TRIAL_COLUMNS = [
    "number",
    "state",
    "outcome",  # studies/outcome.py: the words every output uses
    *knobs.names(),
    records.AMORTISED_STEP_S,
    records.STEP_MEDIAN_S,
    records.COMPILE_S,
    records.MFU,
    records.ACCURACY_ERROR,
    records.BASELINE_ACCURACY_ERROR,
    records.ACCURACY_ERROR_VS_BASELINE,
    records.ACCURACY_EXCESS,
    records.FEASIBLE,
    records.PEAK_MEMORY_BYTES,
    records.ESTIMATED_PEAK_BYTES,
    records.ESTIMATE_ERROR,
    records.FAILURE_KIND,
    records.FAILURE_MESSAGE,
    records.REJECTED_BY,
    records.REPEAT_OF,
    records.TRIAL_WALL_S,
    *COST_KEYS,  # with compile_s, where TRIAL_WALL_S went
    records.HOST,
    "duration_s",
    records.WINDOW_STEP_S,
    records.WINDOW_MFU,
    records.SUPERSEDED,
    records.FIGURE_NOTE,
]
# User attrs left out of trials.csv: whole records (kept in the study) and internal bookkeeping
# (the worker that ran a trial of a shared study; "host" says where it ran).
HIDDEN_ATTRS = (records.MEASUREMENT, records.CANDIDATE, records.MEASURED, records.WORKER)

INTEGER_COLUMNS = ("number", records.REPEAT_OF, records.PEAK_MEMORY_BYTES, records.ESTIMATED_PEAK_BYTES)


def trials_frame(
    study: optuna.Study,
    space: SearchSpace,
    on_run_peak: Callable[[Measurement | None], Measurement | None],
    window_marks: Mapping[int, Mapping[str, Any]] | None = None,
) -> pd.DataFrame:
    """One row per trial that ran or was turned away (not one left queued): settings, outcome,
    objective, measurements, failures; MFU recomputed by `on_run_peak` (the run's one peak);
    `window_marks`: the columns of each trial a window timed again, by number (a repeat takes
    its first trial's, as it takes its figures)."""
    rows = []
    trials = study.get_trials(deepcopy=False)
    read = TuningTrial.all(trials)
    measurements = {r.number: r.measurement for r in read}
    for t, r in zip(trials, read):
        outcome = r.outcome
        if outcome is Outcome.NEVER_RUN:
            continue  # a seed left queued when the search ended: no trial of this run
        row: dict[str, Any] = {"number": t.number, "state": t.state.name, "outcome": str(outcome)}
        row.update(t.params)
        # trials.csv's columns are the record's keys as stored (any version's), passed on verbatim.
        row.update({k: v for k, v in r.stored.items() if k not in HIDDEN_ATTRS})
        if isinstance(row.get(records.WARM_START), dict):  # where the setting came from, not a dict repr
            row[records.WARM_START] = row[records.WARM_START].get("source")
        row["duration_s"] = t.duration.total_seconds() if t.duration else None
        # A repeat carries its first trial's figures: its MFU too, on the run's peak.
        measured = on_run_peak(measurements.get(r.measured_by))
        if measured is not None:
            row.update(mfu=measured.mfu, peak_dtype=measured.peak_dtype)
        row.update((window_marks or {}).get(r.measured_by, {}))
        rows.append(row)
    frame = pd.DataFrame(rows)
    # A stable schema: every documented column is present, even when no trial set it.
    frame = frame.reindex(columns=TRIAL_COLUMNS + [c for c in frame.columns if c not in TRIAL_COLUMNS])
    # Ids and byte counts are integers; pandas' nullable Int64 keeps them so where some rows
    # have none (NaN would turn the whole column into floats: "3.0" in trials.csv).
    for column in INTEGER_COLUMNS:
        frame[column] = pd.to_numeric(frame[column]).round().astype("Int64")
    return frame.drop(columns=[p for p in knobs.names() if p not in {q.name for q in space.searched}])


__all__ = ["TRIAL_COLUMNS", "trials_frame"]
