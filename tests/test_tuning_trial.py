"""A tuning trial read once as a typed record (issue 71): `TuningTrial.of` reads a study of every
layout tpu-tune has written (one attribute a key, before issue 26; the record without a version,
tests/fixtures/old_studies.sql; the versioned record of the last landed version), each field as
the attribute dict says, and the same search reads as the same records whatever its layout."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import optuna
import pytest
from conftest import steady_measurement
from helpers.common import recorded_search

from tpu_tuner.execution.measurement import EarlyStop, Measurement
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.studies import records
from tpu_tuner.studies.liveness import read_storage
from tpu_tuner.studies.outcome import Outcome, outcome_of
from tpu_tuner.studies.trial_costs import COST_KEYS
from tpu_tuner.studies.trial_record import TrialRecord
from tpu_tuner.tuning.search import trial_attrs
from tpu_tuner.tuning.search.tuning_trial import (
    Claims,
    Failure,
    TuningTrial,
    WallTimeSplit,
    measured_peaks,
    measured_steps,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)
FIXTURE = Path(__file__).parent / "fixtures" / "old_studies.sql"


def _flat_flush(self: TrialRecord) -> None:
    """How versions before the structured record stored a trial: one user attribute per key."""
    for key, value in self.values().items():
        self.trial.set_user_attr(key, value)


def _expected(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    """Each field of the record as the attribute dict says it, read key by key."""
    a = records.attrs(trial)
    kind, raw = a.get(records.FAILURE_KIND), a.get(records.MEASUREMENT)
    excess = a.get(records.ACCURACY_EXCESS)
    excess = a.get(records.ACCURACY_ERROR) if excess is None else excess  # older records: no baseline figures
    return {
        "number": trial.number,
        "state": trial.state,
        "params": trial.params,
        "value": trial.value,
        "datetime_complete": trial.datetime_complete,
        "outcome": outcome_of(trial.state.name, a),
        "measured": bool(a.get(records.MEASURED)),
        "measurement": Measurement(**json.loads(raw)) if raw else None,
        "candidate": a.get(records.CANDIDATE),
        "failure": None if kind is None else Failure(kind, a.get(records.FAILURE_MESSAGE)),
        "rejected_by": a.get(records.REJECTED_BY),
        "excluded_by": a.get(records.EXCLUDED_BY),
        "probe_for": a.get(records.PROBE_FOR),
        "early_stop": EarlyStop(**a[records.EARLY_STOP]) if records.EARLY_STOP in a else None,
        "stopped_early": a.get(records.STOPPED_EARLY),
        "costs": WallTimeSplit(a.get(records.TRIAL_WALL_S), *(a.get(key) for key in COST_KEYS)),
        "claims": Claims(
            a.get(records.WORKER),
            a.get(records.HOST),
            tuple(a.get(records.HOSTS, ())),
            a.get(records.REPEAT_OF),
            bool(a.get(records.IN_FLIGHT_ELSEWHERE)),
            bool(a.get(records.OVER_BUDGET)),
        ),
        "feasible": bool(a.get(records.FEASIBLE)),
        "step_median_s": a.get(records.STEP_MEDIAN_S),
        "compile_s": a.get(records.COMPILE_S),
        "mfu": a.get(records.MFU),
        "peak_memory_bytes": a.get(records.PEAK_MEMORY_BYTES),
        "memory_limit_bytes": a.get(records.MEMORY_LIMIT_BYTES),
        "accuracy_excess": None if excess is None else float(excess),
        "start_env": tuple(a.get(records.START_ENV, ())),
        "buckets": tuple(a[records.BUCKETS]) if records.BUCKETS in a else None,
        "padding_waste": a.get(records.PADDING_WASTE),
        "warm_start": a.get(records.WARM_START),
        "stored": a,  # every key, as stored
    }


def _check(trial: optuna.trial.FrozenTrial) -> TuningTrial:
    record, expected = TuningTrial.of(trial), _expected(trial)
    assert {f.name: getattr(record, f.name) for f in fields(record)} == expected, trial.number
    a = records.attrs(trial)
    assert record.is_feasible == (trial.state == optuna.trial.TrialState.COMPLETE and bool(a.get(records.FEASIBLE)))
    assert record.is_repeat == (records.REPEAT_OF in a)
    if trial.value is not None:
        assert record.objective == trial.value
    else:
        with pytest.raises(ValueError):
            _ = record.objective
    return record


@pytest.fixture(scope="module")
def layouts() -> dict[str, list[optuna.trial.FrozenTrial]]:
    """The same search stored now (the versioned record) and one attribute a key (before issue 26)."""
    now = recorded_search().get_trials()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TrialRecord, "flush", _flat_flush)
        flat = recorded_search().get_trials()
    return {"now": now, "flat": flat}


def test_a_fresh_study_and_a_flat_one_read_field_by_field_as_the_same_records(layouts) -> None:
    now, flat = layouts["now"], layouts["flat"]
    assert now[0].user_attrs[records.RECORD][records.VERSION] == records.RECORD_VERSION
    for n, f in zip(now, flat):
        assert _check(n) == _check(f)
    read = TuningTrial.all(now)
    assert [t.outcome for t in read] == [
        Outcome.MEASURED,
        Outcome.REPEAT,
        Outcome.REJECTED,
        Outcome.MEASURED,
        Outcome.FAILED,
    ]
    assert read[0].measurement is not None and read[0].claims.worker == "worker-1"
    assert read[1].claims.repeat_of == 0 and read[1].measurement is None  # a repeat measured nothing
    assert [t.measured_by for t in read] == [0, 0, 2, 3, 4]
    assert [t.failed_to_run for t in read] == [False, False, False, False, True]
    assert read[2].rejected_by is not None and read[4].failure is not None


def test_a_study_of_the_unversioned_record_reads_as_the_same_search_stored_now(tmp_path: Path) -> None:
    path = tmp_path / "study.db"
    with sqlite3.connect(path) as connection:
        connection.executescript(FIXTURE.read_text())
    old = optuna.load_study(study_name="tune", storage=read_storage(f"sqlite:///{path}")).get_trials()
    assert all(records.VERSION not in t.user_attrs[records.RECORD] for t in old)
    for o, n in zip(old, recorded_search().get_trials()):
        was, now = _check(o), _check(n)
        # A knob (a param), the memory estimate and the cost split were added since (tests/test_old_studies.py).
        assert (was.candidate is None) == (now.candidate is None)
        if was.candidate is not None and now.candidate is not None:
            assert Candidate.from_dict(was.candidate) == Candidate.from_dict(now.candidate)
        if was.measurement is not None and now.measurement is not None:
            assert replace(was.measurement, candidate={}) == replace(now.measurement, candidate={})
        same = {"params", "candidate", "measurement", "costs", "start_env"}
        assert replace(was, **{k: None for k in same}) == replace(now, **{k: None for k in same})  # type: ignore[arg-type]


def test_claims_costs_an_early_stop_and_a_warm_start_are_typed() -> None:
    study = optuna.create_study()
    study.enqueue_trial({"x": 1}, user_attrs={records.WARM_START: {"source": "earlier", "trial": 3}})
    trial = study.ask()
    trial.suggest_int("x", 0, 2)
    stop = EarlyStop({"knob": "a"}, "steps", "hopeless", [0.3, 0.4], 2.0, 1.5, 0.25)
    trial_attrs.record_early_stop(trial, stop, 0.01)
    costs = dict(zip(COST_KEYS, (1.0, 2.0, 3.0, 0.5, 0.25, 0.125, 0.0625)))
    TrialRecord.of(trial).write(
        {
            records.WORKER: "w",
            records.HOST: "h",
            records.HOSTS: ["h (node 0)", "g (node 1)"],
            records.TRIAL_WALL_S: 9.0,
            records.START_ENV: ["A=1"],
            records.BUCKETS: [16, 32],
            **costs,
        }
    )
    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    record = _check(study.get_trials()[0])
    assert record.early_stop == stop and record.stopped_early == "hopeless" and not record.feasible
    assert record.outcome is Outcome.STOPPED_EARLY and record.compile_s == 1.5
    assert record.costs == WallTimeSplit(9.0, 1.0, 2.0, 3.0, 0.5, 0.25, 0.125, 0.0625)
    assert record.claims == Claims("w", "h", ("h (node 0)", "g (node 1)"))
    assert (record.start_env, record.buckets) == (("A=1",), (16, 32))
    assert record.warm_start == {"source": "earlier", "trial": 3}


def test_the_figures_the_windows_take_are_the_last_measured_per_setting() -> None:
    study = optuna.create_study()
    for x, step, peak in ((0, 0.2, 10), (1, 0.3, None), (0, 0.25, 12)):
        study.enqueue_trial({"x": x})
        trial = study.ask()
        trial.suggest_int("x", 0, 2)
        m = steady_measurement({"x": x}, step, peak_memory_bytes=peak)
        study.tell(trial, trial_attrs.record_measurement(trial, m, 100, 0.01))
    trials = TuningTrial.all(study.get_trials())
    settings = [{"x": 0}, {"x": 1}, {"x": 2}]
    assert measured_steps(trials, settings) == [0.25, 0.3, None]
    assert measured_peaks(trials, settings) == [12, None, None]
