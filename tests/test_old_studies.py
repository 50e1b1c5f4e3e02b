"""Studies written before issue 37 (main at 981124b, tests/fixtures/old_studies.py) read back with
this version: a tuning study whose records carry no version reads key for key as the same search
stored now, and a plan study whose trials hold each key as its own attribute resumes without a
compile (its compiles count against the budget) into the plan it wrote."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from helpers.common import recorded_search

# A test module imported by another, for now (tests/test_test_hygiene.py): the planner's search tests'
# scripted compiler follows the planner's job, which is being refactored; it moves to the helpers package after.
from helpers.tiny_planner import SEARCH_SPACE, ShapedPool, tiny_llama_problem

from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.planner.plans.plan_options import PlanOptions, PlanSearch, PlanStore, PlanTarget
from tpu_tuner.planner.plans.plan_search import search
from tpu_tuner.studies import records
from tpu_tuner.studies.liveness import read_storage
from tpu_tuner.tuning.search.tuning_trial import TuningTrial

FIXTURE = Path(__file__).parent / "fixtures" / "old_studies.sql"
# Keys whose stored form changed since the fixture was written (a knob, the memory estimate and
# the trial's cost split added): compared as what they read back as, or not at all where the old
# study had none.
SINCE = (
    "candidate",
    records.MEASUREMENT,
    records.ESTIMATED_PEAK_BYTES,
    records.ESTIMATE_ERROR,
    records.ESTIMATE_NOTE,
    records.WORKER_START_S,
    records.STEPS_S,
    records.OVERHEAD_S,
    records.REFERENCE_S,
    records.ESTIMATE_S,
    records.BUILD_S,
    records.JUDGE_S,
    records.START_ENV,
)


@pytest.fixture
def old_url(tmp_path: Path) -> str:
    """The fixture's SQLite file, as main wrote it (its SQL dump loaded into a fresh file)."""
    path = tmp_path / "study.db"
    with sqlite3.connect(path) as connection:
        connection.executescript(FIXTURE.read_text())
    return f"sqlite:///{path}"


def test_an_old_tuning_study_reads_as_the_same_search_stored_now(old_url: str) -> None:
    old = optuna.load_study(study_name="tune", storage=read_storage(old_url)).get_trials()
    new = recorded_search().get_trials()
    assert len(old) == len(new) == 5
    for o, n in zip(old, new):
        assert records.VERSION not in o.user_attrs[records.RECORD]  # the layout of issue 26
        assert n.user_attrs[records.RECORD][records.VERSION] == records.RECORD_VERSION
        # The measurement's JSON names every knob of its day (a knob added since is missing from
        # the old one); what it reads back as is compared on the next line.
        plain = [{k: v for k, v in records.attrs(t).items() if k not in SINCE} for t in (o, n)]
        candidates = [records.attrs(t).get("candidate") for t in (o, n)]
        assert [c is None for c in candidates] == [False, False] or candidates == [None, None]
        if candidates[0] is not None:
            assert Candidate.from_dict(candidates[0]) == Candidate.from_dict(candidates[1])
        assert plain[0] == plain[1], o.number
        old_m, new_m = TuningTrial.of(o).measurement, TuningTrial.of(n).measurement
        assert (old_m is None) == (new_m is None)
        if old_m is not None and new_m is not None:
            assert Candidate.from_dict(old_m.candidate) == Candidate.from_dict(new_m.candidate)
            assert replace(old_m, candidate={}) == replace(new_m, candidate={})
        assert (o.state, o.value, o.constraints) == (n.state, n.value, n.constraints)


def test_an_old_plan_study_resumes_without_a_compile_into_its_plan(old_url: str) -> None:
    stored = optuna.load_study(study_name="plan", storage=read_storage(old_url)).get_trials()
    assert all(records.RECORD not in t.user_attrs for t in stored)  # each key its own attribute
    compiled_before = {t.user_attrs["point"] for t in stored if t.user_attrs.get("outcome") == "compiled"}
    assert len(compiled_before) == 4
    pool = ShapedPool()
    options = PlanOptions(
        PlanTarget("v5p:2x2x2"),
        search=PlanSearch(budget=4, space=SEARCH_SPACE, sampler="tpe", seed=0),
        store=PlanStore(study="plan", url=old_url),
    )
    result = search(tiny_llama_problem(), options, pool, lambda message: None, time.perf_counter())
    assert pool.compiled == []  # the budget was spent by the old trials
    assert result.search is not None and result.search["compiled"] == 4
    assert {plan.point.key() for plan in result.plans} == compiled_before
    summaries = {t["number"]: t for t in result.search["trials"]}
    for trial in stored:
        assert summaries[trial.number]["outcome"] == trial.user_attrs["outcome"]
        assert summaries[trial.number]["worker"] == trial.user_attrs["worker"]
