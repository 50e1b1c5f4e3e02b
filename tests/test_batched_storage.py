"""The batched study storage (studies/batched_storage.py): Optuna's private names still have the
shape it relies on (else it falls back, and this file fails loudly); a trial costs a bounded
number of SQL statements and transactions; its parameters and claim reach another worker before
it is measured; what it stores reads back key for key as the plain storage stores it; a trial
failed as lost elsewhere refuses its late writes; and without the private names the plain path
runs. On SQLite, and the key checks on PostgreSQL (tests/postgres_server.py)."""

from __future__ import annotations

import time
import threading
import uuid
from typing import Any

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

from tpu_tuner.execution.measurement import Measurement
from tpu_tuner.runner.requests import MeasureRequest
from tpu_tuner.runner.trial_runner import JobResult
from tpu_tuner.studies import batched_storage, records
from tpu_tuner.studies.batched_storage import BatchedStorage, supported
from tpu_tuner.studies.liveness import Worker, open_storage
from tpu_tuner.tuning import TuneOptions
from tpu_tuner.tuning.seeding import build_sampler
from tpu_tuner.tuning.space import SearchSpace
from tpu_tuner.tuning.trials import run_search

optuna.logging.set_verbosity(optuna.logging.WARNING)
SPACE = SearchSpace.load("default", "cpu")  # 8 parameters a trial (or so), thousands of settings
TRIALS = 14  # TPE's 10 start-up trials, then TPE


class LookingRunner:
    """Measures at once; before each measurement, `look` sees the study from another worker."""

    workers_started = 0

    def __init__(self, look: Any = None) -> None:
        self.look, self.seen = look, []

    def run(self, request: MeasureRequest, env: Any = None, timeout_s: float | None = None) -> JobResult:
        if self.look is not None:
            self.seen.append(self.look())
        m = Measurement(candidate=dict(request.candidate), step_median=0.2, step_p10=0.19, step_p90=0.21,
                        samples=[0.2] * 20, first_call_seconds=1.5, warmup_seconds=0.5, compile_seconds=1.0,
                        compiles={}, model_flops_per_step=1e10, peak_flops_per_s=1e12, peak_dtype="float32",
                        mfu=0.05, peak_memory_bytes=2**30, accuracy_errors={"loss": 1e-6}, compute_dtype="float32")
        return JobResult(value=m, seconds=0.25)


def _search(storage: optuna.storages.BaseStorage, name: str, runner: LookingRunner, trials: int = TRIALS,
            worker: Worker | None = None) -> optuna.Study:
    options = TuneOptions(trials=trials, agents=(), sampler="tpe", seed=0)
    study = optuna.create_study(storage=storage, study_name=name, direction="minimize",
                                sampler=build_sampler(options, SPACE))
    run_search(study, SPACE, [], runner, MeasureRequest(), options, lambda event: None,  # type: ignore[arg-type]
               time.perf_counter(), worker=worker or Worker("worker-1", "host-1", storage))
    return study


def _counted(storage: optuna.storages.RDBStorage) -> tuple[list[int], list[int]]:
    """Statements and commits the loop's own thread makes: the heartbeat thread's beat every
    second, so its count follows the host's speed, not the storage's design."""
    statements, commits = [0], [0]
    loop_thread = threading.get_ident()

    def count(counter: list[int]) -> Any:
        return lambda *args: counter.__setitem__(0, counter[0] + (threading.get_ident() == loop_thread))

    sqlalchemy.event.listen(storage.engine, "before_cursor_execute", count(statements))
    sqlalchemy.event.listen(storage.engine, "commit", count(commits))
    return statements, commits


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'studies.db'}"
    from postgres_server import PASSWORD

    # The role that owns the tables whichever test made them first (tests/test_postgres_storage.py).
    return request.getfixturevalue("postgres").url("secret", PASSWORD)


def test_optunas_private_names_have_the_shape_the_batched_storage_relies_on(tmp_path) -> None:
    """If this fails, Optuna changed: tpu-tune still runs (the plain path, 3x the statements),
    but studies/batched_storage.py needs updating to the new shape."""
    from optuna.storages._cached_storage import _CachedStorage
    from optuna.storages._rdb import models

    import inspect

    for name, parameters in batched_storage._OVERRIDDEN.items():
        assert list(inspect.signature(getattr(optuna.storages.RDBStorage, name)).parameters)[1:] == parameters, name
    for method, called in batched_storage._CALLED_BY.items():
        assert called in getattr(_CachedStorage, method).__code__.co_names, (method, called)
    for table, (key, columns) in batched_storage._WRITTEN.items():
        assert set(key) | columns <= set(getattr(models, table).__table__.columns.keys()), table
    assert supported()
    storage = open_storage(f"sqlite:///{tmp_path / 'studies.db'}")
    assert isinstance(storage, BatchedStorage) and storage.batching


def test_a_trial_costs_few_statements_and_transactions_on_sqlite(tmp_path) -> None:
    """113 statements (its BEGIN IMMEDIATE counted) and 26 transactions a trial on SQLite before
    (87 / 26 on PostgreSQL): now about a quarter and a third. The loop's stale-trial look runs once
    a heartbeat interval, so a slower host makes a few more (30.1 a trial at load 3.4)."""
    storage = open_storage(f"sqlite:///{tmp_path / 'studies.db'}", 1)
    statements, commits = _counted(storage)
    study = _search(storage, "count", LookingRunner())
    measured = [t for t in study.get_trials() if records.attrs(t).get(records.MEASURED)]
    assert len(measured) == TRIALS
    # Per trial, the first's writes made one at a time (a parameter name's first use) included.
    assert statements[0] / TRIALS <= 33, statements[0] / TRIALS
    assert commits[0] / TRIALS <= 10, commits[0] / TRIALS


def test_a_trials_setting_and_claim_reach_other_workers_before_it_is_measured(url) -> None:
    name = f"visible-{uuid.uuid4().hex[:8]}"
    other = optuna.storages.RDBStorage(url)  # another worker's view: a storage of its own

    def look() -> tuple[dict[str, Any], Any]:
        (running,) = optuna.load_study(study_name=name, storage=other).get_trials(states=(TrialState.RUNNING,))
        return running.params, records.attrs(running).get(records.WORKER)

    runner = LookingRunner(look)
    study = _search(open_storage(url, 1), name, runner)
    measured = [t for t in study.get_trials() if records.attrs(t).get(records.MEASURED)]
    assert [params for params, _ in runner.seen] == [t.params for t in measured]
    assert all(params and worker == "worker-1" for params, worker in runner.seen)


def test_what_a_trial_stores_reads_back_key_for_key_as_the_plain_storage_stores_it(url) -> None:
    batched, plain = open_storage(url, 1), optuna.storages.RDBStorage(url)
    name = f"records-{uuid.uuid4().hex[:8]}"
    looked: list[tuple[Any, Any]] = []

    def look() -> None:  # this process's view of the running trial is the database's
        (running,) = optuna.load_study(study_name=name, storage=plain).get_trials(states=(TrialState.RUNNING,))
        looked.append((batched.get_trial(running._trial_id), running))

    new = _search(batched, name, LookingRunner(look))
    old = _search(plain, f"plain-{name}", LookingRunner())
    assert all(mine == theirs for mine, theirs in looked) and len(looked) == TRIALS
    fresh = optuna.load_study(study_name=name, storage=optuna.storages.RDBStorage(url)).get_trials()
    for n, o, f in zip(new.get_trials(), old.get_trials(), fresh, strict=True):
        assert n == f  # this process's copy of a trial is the database's, dates and all
        assert batched.get_trial(f._trial_id) == f
        assert dict(records.attrs(n)) == dict(records.attrs(o)), n.number
        assert (n.state, n.values, n.params, n.system_attrs, n.intermediate_values) == (
            o.state, o.values, o.params, o.system_attrs, o.intermediate_values)


def test_a_trial_failed_as_lost_elsewhere_refuses_its_held_writes(url) -> None:
    storage = open_storage(url, 1)
    study = optuna.create_study(storage=storage, study_name=f"lost-{uuid.uuid4().hex[:8]}")
    other = optuna.storages.RDBStorage(url)
    for flush_first in (True, False):
        trial = study.ask()
        trial.suggest_float("x", 0, 1)
        trial.set_user_attr(records.WORKER, "here")
        trial.set_constraint("accuracy", -1.0)
        assert other.get_trial(trial._trial_id).user_attrs == {}  # held, not written
        if flush_first:
            batched_storage.flush(storage)
            assert other.get_trial(trial._trial_id).user_attrs == {records.WORKER: "here"}
        other.set_trial_state_values(trial._trial_id, TrialState.FAIL)  # another worker: lost
        trial.set_user_attr(records.MEASURED, True)
        with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
            study.tell(trial, 1.0)
        stored = other.get_trial(trial._trial_id)
        assert stored.state == TrialState.FAIL and records.MEASURED not in stored.user_attrs
        assert study.get_trials()[trial.number].state == TrialState.FAIL
    held = study.ask()
    held.set_user_attr(records.WORKER, "here")
    other.set_trial_state_values(held._trial_id, TrialState.FAIL)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        batched_storage.flush(storage)


def test_a_read_of_the_study_makes_the_held_writes_first_and_a_queued_trial_is_batched_too(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    storage, other = open_storage(url, 1), optuna.storages.RDBStorage(url)
    study = optuna.create_study(storage=storage, study_name="s")
    study.tell(study.ask({"y": optuna.distributions.FloatDistribution(0, 1)}), 1.0)  # y's first use: written at once
    study.enqueue_trial({"x": 0.5}, user_attrs={records.WARM_START: {"source": "earlier"}})
    trial = study.ask()  # popped from the queue
    assert trial.suggest_float("x", 0, 1) == 0.5 and trial.suggest_float("y", 0, 1) is not None
    trial.set_user_attr(records.WORKER, "here")
    held = other.get_trial(trial._trial_id)
    assert "y" not in held.params and records.WORKER not in held.user_attrs
    read = study.get_trials()[trial.number]
    assert read.params.keys() == {"x", "y"} and records.attrs(read)[records.WORKER] == "here"
    assert records.attrs(read)[records.WARM_START] == {"source": "earlier"}
    assert other.get_trial(trial._trial_id) == read
    study.tell(trial, 2.0)
    assert other.get_trial(trial._trial_id) == storage.get_trial(trial._trial_id) == study.get_trials()[trial.number]


def test_a_read_that_answers_this_processs_trials_from_memory_still_sees_every_other_trial(url) -> None:
    name = f"reads-{uuid.uuid4().hex[:8]}"
    mine, theirs = open_storage(url, 1), open_storage(url, 1)
    here = optuna.create_study(storage=mine, study_name=name)
    there = optuna.load_study(study_name=name, storage=theirs)
    first = here.ask()
    first.suggest_float("x", 0, 1)
    assert [t.number for t in here.get_trials()] == [0]
    other = there.ask()  # asked elsewhere: read from the database, not from memory
    other.suggest_float("x", 0, 1)
    batched_storage.flush(theirs)
    second = here.ask()
    read = here.get_trials()
    assert [t.number for t in read] == [0, 1, 2] and read[1].params == other.params
    there.tell(other, 3.0)
    here.tell(first, 1.0)
    assert [(t.number, t.state) for t in here.get_trials()] == [
        (0, TrialState.COMPLETE), (1, TrialState.COMPLETE), (2, TrialState.RUNNING)]
    assert here.get_trials() == optuna.load_study(study_name=name, storage=url).get_trials()
    here.tell(second, 2.0)
    with pytest.raises(KeyError):
        mine._get_trials(10**6, None, set(), -1)  # no such study: as Optuna's read says


def test_a_trial_whose_beats_stop_is_found_stale_and_retried_a_beating_one_is_not(url) -> None:
    """The heartbeat is one upsert at the database's clock: Optuna's stale check reads it."""
    from tpu_tuner.studies.liveness import Heartbeat, fail_lost_trials, is_lost

    name = f"beats-{uuid.uuid4().hex[:8]}"
    storage = open_storage(url, 1, 2)
    study = optuna.create_study(storage=storage, study_name=name)
    lost, alive = study.ask(), study.ask()
    for trial in (lost, alive):
        trial.suggest_float("x", 0, 1)
    batched_storage.flush(storage)
    with Heartbeat(storage, lost._trial_id):  # one beat, then its worker "dies"
        pass
    with Heartbeat(storage, alive._trial_id):
        time.sleep(3.2)  # past the grace period of the stopped one
        other = open_storage(url, 1, 2)  # another worker looks
        trials = fail_lost_trials(optuna.load_study(study_name=name, storage=other), other)
    assert is_lost(trials[lost.number]) and trials[alive.number].state == TrialState.RUNNING
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == lost.number]
    assert retry.state == TrialState.WAITING and retry.params == trials[lost.number].params
    study.tell(alive, 1.0)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        study.tell(lost, 1.0)  # its late result is refused


def test_without_the_private_names_the_plain_path_runs(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(batched_storage._CALLED_BY, "set_trial_param", "_renamed_in_a_later_optuna")
    assert not supported()
    storage = open_storage(f"sqlite:///{tmp_path / 'studies.db'}", 1)
    assert isinstance(storage, BatchedStorage) and not storage.batching
    statements, _ = _counted(storage)
    study = _search(storage, "plain", LookingRunner(), trials=3)
    assert len([t for t in study.get_trials() if records.attrs(t).get(records.MEASURED)]) == 3
    assert statements[0] / 3 > 60  # every write a transaction of its own, as Optuna makes it
    monkeypatch.setattr(batched_storage, "_models", lambda: (_ for _ in ()).throw(ImportError("moved")))
    assert not supported()


def test_the_storage_pickles_without_its_held_writes_lost(tmp_path) -> None:
    import pickle

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    storage = open_storage(url, 1)
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    trial.set_user_attr(records.WORKER, "here")
    copied = pickle.loads(pickle.dumps(storage))  # held writes made first
    assert copied.batching
    assert optuna.storages.RDBStorage(url).get_trial(trial._trial_id).user_attrs == {records.WORKER: "here"}
