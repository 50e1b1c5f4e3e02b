"""The study layer's record of a trial (issue 71): `StudyTrial.of` reads the loop's keys of a
study of every layout tpu-tune has written (one attribute a key, before issue 26; the record
without a version, tests/fixtures/old_studies.sql; the versioned record of the last landed
version), and every reader built on it (coverage, liveness, the tuner's loop hooks, trials.csv,
a repeat's copy) answers the same of the same search whatever its layout."""

from __future__ import annotations

import sqlite3
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, cast

import optuna
import pandas as pd
import pytest
from helpers.common import RECORD_SPACE, recorded_search

from tpu_tuner.core.failures import FailureKind
from tpu_tuner.studies import liveness, records
from tpu_tuner.studies.coverage import covered_settings, last_measured, measured_count
from tpu_tuner.studies.liveness import RetryLostTrial, is_lost, read_storage
from tpu_tuner.studies.study_trial import Claims, Failure, StudyTrial
from tpu_tuner.studies.trial_record import TrialRecord
from tpu_tuner.tuning.search import trial_attrs
from tpu_tuner.tuning.search.trials import TuneTrials
from tpu_tuner.tuning.search.trials_table import trials_frame

optuna.logging.set_verbosity(optuna.logging.WARNING)
FIXTURE = Path(__file__).parent / "fixtures" / "old_studies.sql"


def _flat_flush(self: TrialRecord) -> None:
    """How versions before the structured record stored a trial: one user attribute per key."""
    for key, value in self.values().items():
        self.trial.set_user_attr(key, value)


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, optuna.Study]:
    """The same search stored now, one attribute a key, and by the version of issues 26-37."""
    now = recorded_search()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TrialRecord, "flush", _flat_flush)
        flat = recorded_search()
    path = tmp_path_factory.mktemp("old") / "study.db"
    with sqlite3.connect(path) as connection:
        connection.executescript(FIXTURE.read_text())
    unversioned = optuna.load_study(study_name="tune", storage=read_storage(f"sqlite:///{path}"))
    return {"now": now, "flat": flat, "unversioned": unversioned}


def _check(trial: optuna.trial.FrozenTrial) -> StudyTrial:
    """The record, each field as the attribute dict says it, read key by key."""
    record, a = StudyTrial.of(trial), records.attrs(trial)
    kind = a.get(records.FAILURE_KIND)
    expected = {
        "number": trial.number,
        "state": trial.state,
        "params": trial.params,
        "value": trial.value,
        "datetime_complete": trial.datetime_complete,
        "claims": Claims(
            a.get(records.WORKER),
            a.get(records.HOST),
            tuple(a.get(records.HOSTS, ())),
            a.get(records.REPEAT_OF),
            bool(a.get(records.IN_FLIGHT_ELSEWHERE)),
            bool(a.get(records.OVER_BUDGET)),
        ),
        "failure": None if kind is None else Failure(kind, a.get(records.FAILURE_MESSAGE)),
        "rejected_by": a.get(records.REJECTED_BY),
        "excluded_by": a.get(records.EXCLUDED_BY),
        "measured": bool(a.get(records.MEASURED)),
        "warm_start": a.get(records.WARM_START),
        "stored": a,
    }
    assert {f.name: getattr(record, f.name) for f in fields(record)} == expected, trial.number
    assert record.lost == (trial.state.name == "FAIL" and records.FAILURE_KIND not in a) == is_lost(trial)
    return record


@pytest.mark.parametrize("layout", ["now", "flat", "unversioned"])
def test_every_layout_reads_field_by_field_as_the_search_stored_now(layouts, layout: str) -> None:
    read = [_check(t) for t in layouts[layout].get_trials()]
    now = StudyTrial.all(layouts["now"].get_trials())
    # Optuna's clock and (for the old version) a knob added since differ; the record's fields do not.
    assert [replace(r, params={}, datetime_complete=None) for r in read] == [
        replace(r, params={}, datetime_complete=None) for r in now
    ]
    assert [r.claims.worker for r in read] == ["worker-1"] * 5
    assert [r.claims.repeat_of for r in read] == [None, 0, None, None, None]
    assert [r.failure_kind for r in read] == [None, None, None, FailureKind.ACCURACY, read[4].failure_kind]
    assert read[2].rejected_by is not None and read[4].failure is not None and not any(r.lost for r in read)


@pytest.mark.parametrize("layout", ["flat", "unversioned"])
def test_coverage_and_the_loops_hooks_answer_the_same_of_every_layout(layouts, layout: str) -> None:
    old, now = layouts[layout].get_trials(), layouts["now"].get_trials()
    old_covered, now_covered = covered_settings(old), covered_settings(now)
    assert [t.number for t in old_covered.values()] == [t.number for t in now_covered.values()] == [0, 2, 3, 4]
    assert measured_count(old_covered) == measured_count(now_covered) == 3  # the rejection costs nothing
    assert last_measured(old).number == last_measured(now).number == 4
    # The tuner's hooks read no other state of the feature: asked here without one.
    feature = cast(TuneTrials, None)
    for trials in (old, now):
        assert [TuneTrials.setting_written(feature, t) for t in trials] == [True] * 5
        assert [TuneTrials.spends(feature, t) for t in trials] == [True, True, False, True, True]


def _told(study: optuna.Study, flat: bool, **keys: Any) -> optuna.trial.FrozenTrial:
    """A trial told PRUNED (FAIL where `keys` hold no failure kind and `fail`) with `keys` stored."""
    state = optuna.trial.TrialState.FAIL if keys.pop("fail", False) else optuna.trial.TrialState.PRUNED
    trial = study.ask()
    if flat:
        for key, value in keys.items():
            trial.set_user_attr(key, value)
    else:
        TrialRecord.of(trial).write(keys)
    study.tell(trial, state=state)
    return study.get_trials()[-1]


@pytest.mark.parametrize("flat", [False, True])
def test_a_lost_trial_a_turned_away_one_and_the_retry_keep_their_meaning(flat: bool, monkeypatch) -> None:
    study = optuna.create_study()
    lost = _told(study, flat, fail=True, **{records.WORKER: "w", records.MEASURED: True})
    failed = _told(study, flat, fail=True, **{records.FAILURE_KIND: FailureKind.INTERRUPTED})
    excluded = _told(study, flat, **{records.EXCLUDED_BY: "k=v"})
    refused = _told(study, flat, **{records.FAILURE_KIND: FailureKind.WOULD_NOT_FIT})
    released = _told(study, flat, **{records.OVER_BUDGET: True})
    assert [is_lost(t) for t in (lost, failed, excluded)] == [True, False, False]
    assert [TuneTrials.spends(cast(TuneTrials, None), t) for t in (excluded, refused, released)] == [False, False, True]
    assert covered_settings([lost, failed, released]) == {}  # measured by nobody: measured again
    # The retry carries how the setting was queued and nothing of the lost run.
    warm = {"source": "earlier", "trial": 3}
    stale = _told(study, flat, fail=True, **{records.WARM_START: warm, records.MEASURED: True})
    kept: list[dict[str, Any]] = []
    monkeypatch.setattr(
        liveness.optuna.storages.RetryHeartbeatStaleTrialCallback, "__call__", lambda _, s, t: kept.append(t.user_attrs)
    )
    RetryLostTrial()(study, stale)
    RetryLostTrial()(study, lost)
    assert kept == [{records.WARM_START: warm}, {}]


@pytest.mark.parametrize("layout", ["flat", "unversioned"])
def test_trials_csv_and_a_repeats_copy_pass_on_every_stored_key(layouts, layout: str) -> None:
    old, now = layouts[layout], layouts["now"]
    frames = [trials_frame(s, RECORD_SPACE, lambda m: m).drop(columns="duration_s") for s in (old, now)]
    if layout == "flat":
        assert frames[0].equals(frames[1])
    for trial, (_, row) in zip(old.get_trials(), frames[0].iterrows()):
        for key, value in records.attrs(trial).items():
            if key not in (records.MEASUREMENT, records.CANDIDATE, records.MEASURED, records.WORKER, records.MFU):
                assert pd.isna(row[key]) if value is None else row[key] == value, (trial.number, key)
    # A repeat of the first trial copies its keys as stored (any layout), the constraints with them.
    source = old.get_trials()[0]
    target = optuna.create_study()
    trial = target.ask()
    trial_attrs.copy_attrs(source, trial, 0.01)
    target.tell(trial, source.value)
    copy = target.get_trials()[0]
    kept = {k: v for k, v in records.attrs(source).items() if k not in trial_attrs.NOT_COPIED}
    assert dict(records.attrs(copy)) == {**kept, records.REPEAT_OF: 0}
    assert copy.constraints == source.constraints
