"""A planner trial read once as a typed record (issue 71): `PlanTrial.of` reads a plan study of
every layout (one attribute a key before issue 37: tests/fixtures/old_studies.sql; the record
now), each field as the attribute dict says."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import optuna
from helpers.tiny_planner import SEARCH_SPACE, ShapedPool, tiny_llama_problem

from tpu_tuner.planner.plans.plan_options import PlanOptions, PlanSearch, PlanStore, PlanTarget
from tpu_tuner.planner.plans.plan_search import search
from tpu_tuner.planner.plans.plan_trial import PlanTrial, compiled_from_dict
from tpu_tuner.studies import records
from tpu_tuner.studies.liveness import read_storage
from tpu_tuner.studies.records import PlanOutcome
from tpu_tuner.studies.study_trial import StudyTrial

FIXTURE = Path(__file__).parent / "fixtures" / "old_studies.sql"


def _expected(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    a = records.attrs(trial)
    compiled = a.get(records.COMPILED_STEP)
    study = StudyTrial.of(trial)  # the study layer's fields, read as tests/test_study_trial.py checks
    return {
        **{f.name: getattr(study, f.name) for f in fields(StudyTrial)},
        "outcome": a.get(records.OUTCOME),
        "reason": a.get(records.REASON),
        "point": a.get(records.POINT),
        "compiling": a.get(records.COMPILING),
        "compiled": compiled_from_dict(compiled) if compiled is not None else None,
        "fit_effort": a.get(records.FIT_EFFORT),
        "constraint": a.get(records.CONSTRAINT_VALUE),
    }


def _check(trials: list[optuna.trial.FrozenTrial]) -> list[PlanTrial]:
    read = PlanTrial.all(trials)
    for trial, record in zip(trials, read):
        assert {f.name: getattr(record, f.name) for f in fields(record)} == _expected(trial), trial.number
        assert record.worker == records.attrs(trial).get(records.WORKER)
        assert record.spends == (record.outcome in (PlanOutcome.COMPILED, PlanOutcome.REFUSED))
    return read


def test_an_old_plan_study_and_a_new_one_read_field_by_field(tmp_path: Path) -> None:
    path = tmp_path / "study.db"
    with sqlite3.connect(path) as connection:
        connection.executescript(FIXTURE.read_text())
    old = optuna.load_study(study_name="plan", storage=read_storage(f"sqlite:///{path}")).get_trials()
    assert all(records.RECORD not in t.user_attrs for t in old)  # each key its own attribute
    assert sum(1 for t in _check(old) if t.outcome is PlanOutcome.COMPILED and t.compiled is not None) == 4

    url = f"sqlite:///{tmp_path / 'new.db'}"
    options = PlanOptions(
        PlanTarget("v5p:2x2x2"),
        search=PlanSearch(budget=4, space=SEARCH_SPACE, sampler="tpe", seed=0),
        store=PlanStore(study="plan", url=url),
    )
    search(tiny_llama_problem(), options, ShapedPool(), lambda message: None, time.perf_counter())
    new = optuna.load_study(study_name="plan", storage=read_storage(url)).get_trials()
    assert all(records.RECORD in t.user_attrs for t in new)
    read = _check(new)
    assert sum(1 for t in read if t.spends) == 4 and all(t.compiling is False for t in read if t.spends)
