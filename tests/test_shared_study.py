"""A study shared by name, without a model: joining and its refusals (tuning/run/shared_study.py), and
liveness (studies/liveness.py): a trial whose heartbeat stops is failed as lost and queued again,
a beating one is left alone. On SQLite files in a temporary folder (the PostgreSQL server runs
the whole thing in test_many_workers.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from conftest import FIXTURES, FakeClock, wait_until

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.studies import liveness, records
from tpu_tuner.studies.liveness import Heartbeat, RunningWatch, fail_lost_trials, is_lost, open_storage
from tpu_tuner.studies.loop import StopReason
from tpu_tuner.tuning.options.tune_options import ObjectiveOptions, SearchOptions, TuneOptions
from tpu_tuner.tuning.run.shared_study import (
    RECORD_ATTR,
    RECORD_FORMAT,
    adopt_options,
    join_differences,
    make_record,
    open_shared,
)
from tpu_tuner.tuning.search.search_space import SearchSpace

SPACE = SearchSpace.load(FIXTURES / "eager_precision_space.toml", "cpu")
FINGERPRINT = {
    "model_file": "/host-a/gpt.py",
    "sha256": "a" * 64,
    "convention": "native",
    "step_kind": "training",
    "inputs": [[[8, 256], "int64"]],
    "batch_size": 8,
    "seq_len": 256,
    "device_kind": "cpu",
    "device_name": "AMD EPYC",
    "nproc": 1,
    "versions": {"torch": "2.13.0", "optuna": "5.0.0"},
}


def _storage(tmp_path: Path, interval: int = 1, grace: int | None = 2) -> optuna.storages.RDBStorage:
    return open_storage(f"sqlite:///{tmp_path / 'studies.db'}", interval, grace)


def test_a_second_worker_joins_and_adopts_the_study_budget(tmp_path) -> None:
    storage = _storage(tmp_path)
    first = open_shared(
        storage,
        "s",
        optuna.samplers.RandomSampler(),
        make_record(
            FINGERPRINT,
            SPACE,
            TuneOptions(search=SearchOptions(trials=7), objective=ObjectiveOptions(planned_steps=100)),
        ),
        SPACE,
    )
    # Another host: the file lies elsewhere and the CPU has another name; same workload.
    elsewhere = {**FINGERPRINT, "model_file": "/host-b/gpt.py", "device_name": "Intel Xeon"}
    second = open_shared(
        storage,
        "s",
        optuna.samplers.RandomSampler(),
        make_record(elsewhere, SPACE, TuneOptions(search=SearchOptions(trials=3))),
        SPACE,
    )
    assert first.created and not second.created
    adopted = adopt_options(
        TuneOptions(search=SearchOptions(trials=3), objective=ObjectiveOptions(planned_steps=5000)), second.record
    )
    assert adopted.search.trials == 7 and adopted.objective.planned_steps == 100


@pytest.mark.parametrize(
    "change, words",
    [
        ({"sha256": "b" * 64}, "model file differs"),
        ({"batch_size": 16}, "--batch-size differs"),
        ({"device_kind": "cuda"}, "device kind differs"),
    ],
)
def test_a_worker_with_another_workload_is_refused_in_one_line(tmp_path, change, words) -> None:
    storage = _storage(tmp_path)
    open_shared(storage, "s", optuna.samplers.RandomSampler(), make_record(FINGERPRINT, SPACE, TuneOptions()), SPACE)
    with pytest.raises(UserInputError, match=f"--study s: join refused: {words}") as info:
        open_shared(
            storage,
            "s",
            optuna.samplers.RandomSampler(),
            make_record({**FINGERPRINT, **change}, SPACE, TuneOptions()),
            SPACE,
        )
    assert len(str(info.value).splitlines()) == 1


def test_a_worker_with_another_space_is_refused() -> None:
    other = SearchSpace.load("default", "cpu")
    found = join_differences(make_record(FINGERPRINT, SPACE, TuneOptions()), FINGERPRINT, other)
    assert len(found) == 1 and found[0].startswith("search space differs ('default': parameters ")


@pytest.mark.parametrize("recorded_format, joins", [(1, True), (2, True), (3, False)])
def test_a_study_of_the_flat_record_format_is_joined_one_of_a_later_format_refused(
    tmp_path, recorded_format, joins
) -> None:
    """Format 1 studies hold each trial key as its own attribute, which this version reads; a
    format-1 worker cannot read this version's structured records, and refuses format 2."""
    storage = _storage(tmp_path)
    study = optuna.create_study(storage=storage, study_name="s")
    study.set_user_attr(RECORD_ATTR, {**make_record(FINGERPRINT, SPACE, TuneOptions()), "format": recorded_format})
    ours = make_record(FINGERPRINT, SPACE, TuneOptions())
    if joins:
        assert not open_shared(storage, "s", optuna.samplers.RandomSampler(), ours, SPACE).created
    else:
        with pytest.raises(UserInputError, match="recorded by another version of tpu-tune"):
            open_shared(storage, "s", optuna.samplers.RandomSampler(), ours, SPACE)
    assert make_record(FINGERPRINT, SPACE, TuneOptions())["format"] == RECORD_FORMAT == 2


def test_a_study_not_made_by_tpu_tune_is_refused_after_waiting(tmp_path) -> None:
    storage = _storage(tmp_path)
    optuna.create_study(storage=storage, study_name="theirs")
    with pytest.raises(UserInputError, match="not created by tpu-tune"):
        open_shared(
            storage,
            "theirs",
            optuna.samplers.RandomSampler(),
            make_record(FINGERPRINT, SPACE, TuneOptions()),
            SPACE,
            wait_s=0.5,
        )


def test_a_trial_whose_heartbeat_stops_is_failed_and_queued_again_a_beating_one_is_not(tmp_path) -> None:
    storage = _storage(tmp_path, interval=1, grace=2)
    study = optuna.create_study(storage=storage, study_name="s")
    lost = study.ask({"x": optuna.distributions.CategoricalDistribution(["a", "b"])})
    lost.set_user_attr("worker", "dead")
    with Heartbeat(storage, lost._trial_id):  # one beat, then its worker "dies"
        pass
    alive = study.ask({"x": optuna.distributions.CategoricalDistribution(["a", "b"])})
    alive.set_user_attr("worker", "alive")
    with Heartbeat(storage, alive._trial_id):
        # The stopped one goes stale a grace period (2 s) after its beat, by the storage's clock.
        wait_until(
            lambda: is_lost(fail_lost_trials(study, storage)[lost.number]), 60, lambda: "the stopped trial failed"
        )
        states = {t.number: t for t in study.get_trials(deepcopy=False)}
        assert states[alive.number].state == optuna.trial.TrialState.RUNNING
    assert is_lost(states[lost.number])
    retry = [t for t in states.values() if t.system_attrs.get("failed_trial") == lost.number]
    assert len(retry) == 1 and retry[0].state == optuna.trial.TrialState.WAITING
    assert retry[0].params == states[lost.number].params
    study.tell(alive, 1.0)


def test_the_stale_check_runs_once_a_heartbeat_interval(tmp_path, monkeypatch) -> None:
    """A trial goes stale only a grace period after its last beat: the loop's round (one a trial)
    looks for stale trials at most once a beat, not every round."""
    clock = FakeClock()
    monkeypatch.setattr(liveness, "time", clock)
    storage = _storage(tmp_path, interval=1, grace=2)
    study = optuna.create_study(storage=storage, study_name="s")
    checks = []
    real = optuna.storages.fail_stale_trials
    monkeypatch.setattr(optuna.storages, "fail_stale_trials", lambda s: checks.append(1) or real(s))
    for _ in range(3):
        fail_lost_trials(study, storage)
    clock.now += 0.99
    fail_lost_trials(study, storage)
    assert checks == [1]
    clock.now += 0.01  # a beat after the first check
    fail_lost_trials(study, storage)
    assert checks == [1, 1]


def test_a_trial_seen_running_too_long_is_failed_and_retried_without_its_leftovers(tmp_path, monkeypatch) -> None:
    storage = _storage(tmp_path, interval=1, grace=2)
    study = optuna.create_study(storage=storage, study_name="s")
    study.enqueue_trial({"x": "a"}, user_attrs={"warm_start": {"source": "earlier"}})
    orphan = study.ask({"x": optuna.distributions.CategoricalDistribution(["a", "b"])})
    # Its worker died halfway through recording a measurement, never having beaten.
    orphan.set_user_attr("measured", True)
    orphan.set_user_attr("worker", "gone")
    clock = FakeClock()
    monkeypatch.setattr(liveness, "time", clock)
    watch = RunningWatch(overdue_s=0.3)
    fail_lost_trials(study, storage, watch)  # first seen now: left alone
    clock.now += 0.3
    fail_lost_trials(study, storage, watch)  # not over the limit yet
    assert study.get_trials(deepcopy=False)[orphan.number].state == optuna.trial.TrialState.RUNNING
    clock.now += 0.01
    fail_lost_trials(study, storage, watch)
    trials = study.get_trials(deepcopy=False)
    assert is_lost(trials[orphan.number])
    retry = next(t for t in trials if t.system_attrs.get("failed_trial") == orphan.number)
    assert retry.user_attrs == {"warm_start": {"source": "earlier"}}  # not "measured", not its worker


def test_queued_trials_are_popped_once_by_concurrent_processes_on_sqlite(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    study = optuna.create_study(storage=open_storage(url), study_name="q")
    for i in range(60):
        study.enqueue_trial({"x": i})
    popper = (
        "import sys, warnings, optuna\n"
        "warnings.simplefilter('ignore'); optuna.logging.set_verbosity(optuna.logging.ERROR)\n"
        "from tpu_tuner.studies.liveness import open_storage\n"
        f"study = optuna.load_study(study_name='q', storage=open_storage({url!r}))\n"
        "while study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):\n"
        "    trial = study.ask()\n"
        "    study.tell(trial, 0.0)\n"
        "    print(trial.number, flush=True)\n"
    )
    workers = [
        subprocess.Popen([sys.executable, "-c", popper], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outputs = [w.communicate(timeout=120) for w in workers]
    # A trial popped twice fails its second `tell` (UpdateFinishedTrialError): no process may fail.
    assert all(w.returncode == 0 for w in workers), [err[-500:] for _, err in outputs]
    popped = [int(n) for out, _ in outputs for n in out.split()]
    assert len(popped) == len(set(popped)) >= 60


def _trial(number: int, params: dict, state: optuna.trial.TrialState, worker: str, **attrs) -> optuna.trial.FrozenTrial:
    distributions = {k: optuna.distributions.CategoricalDistribution(SPACE.grid()[k]) for k in params}
    return optuna.trial.create_trial(
        params=params,
        distributions=distributions,
        state=state,
        value=1.0 if state == optuna.trial.TrialState.COMPLETE else None,
        user_attrs={"worker": worker, "host": "h", **attrs},
    )


def test_a_worker_asking_past_the_budget_releases_its_trial_unmeasured(tmp_path) -> None:
    from tpu_tuner.runner.requests import MeasureRequest
    from tpu_tuner.studies.liveness import Worker
    from tpu_tuner.studies.loop import Rules, Settled, settle
    from tpu_tuner.tuning.search.trials import TuneTrials

    study = optuna.create_study()
    study.add_trial(
        _trial(
            0,
            {"matmul_precision": "highest", "autocast": "none"},
            optuna.trial.TrialState.COMPLETE,
            "a",
            measured=True,
            feasible=True,
        )
    )
    # Another worker's trial is running: with it the budget of 2 is spoken for.
    study.enqueue_trial({"matmul_precision": "medium", "autocast": "bfloat16"})
    other = study.ask()
    SPACE.suggest(other)

    class NoRunner:
        def run(self, *args, **kwargs):
            raise AssertionError("measured past the budget")

    study.enqueue_trial({"matmul_precision": "high", "autocast": "none"})  # neither measured nor running
    late = study.ask()
    trials = TuneTrials(
        study,
        SPACE,
        [],
        NoRunner(),
        MeasureRequest(),
        TuneOptions(search=SearchOptions(trials=2)),
        lambda event: None,
        0.0,
        None,
        None,
        Worker("b", "h"),
    )
    assert settle(study, trials, Rules(budget=2), late, []) is Settled.RELEASED
    released = study.get_trials(deepcopy=False)[late.number]
    assert released.state == optuna.trial.TrialState.PRUNED and records.attrs(released).get("over_budget")
    assert "measured" not in records.attrs(released)


def test_the_worker_that_measured_last_verifies_once(tmp_path) -> None:
    from tpu_tuner.studies.liveness import Worker
    from tpu_tuner.tuning.run.shared_study import record_verification, verification_left_to
    from tpu_tuner.tuning.verify.verification import Verification

    storage = _storage(tmp_path)
    study = optuna.create_study(storage=storage, study_name="s")
    study.add_trial(_trial(0, {"matmul_precision": "highest"}, optuna.trial.TrialState.COMPLETE, "a", measured=True))
    study.add_trial(_trial(1, {"matmul_precision": "medium"}, optuna.trial.TrialState.COMPLETE, "b", measured=True))
    # A repeat answered later by worker a measures nothing: b still measured last.
    study.add_trial(_trial(2, {"matmul_precision": "medium"}, optuna.trial.TrialState.COMPLETE, "a", repeat_of=1))
    a, b = Worker("a", "h", storage, poll_s=0.1), Worker("b", "h", storage, poll_s=0.1)
    watch = RunningWatch(60)
    assert verification_left_to(study, b, StopReason.BUDGET, watch) is None
    assert "worker b measured the study's last trial" in verification_left_to(study, a, StopReason.BUDGET, watch)
    assert "--timeout" in verification_left_to(study, b, StopReason.TIMEOUT, watch)
    done = Verification(
        baseline_trial=0,
        best_trial=1,
        chosen=SPACE.to_candidate({"matmul_precision": "medium"}),
        chosen_is_best=True,
        speedup=None,
        message="verified",
    )
    record_verification(study, done, "/runs/b", "b", measured=2)
    assert "was verified by worker b" in verification_left_to(study, b, StopReason.BUDGET, watch)
    # The study measured more since (a resumed worker): verified again, by who measured last.
    study.add_trial(_trial(3, {"matmul_precision": "high"}, optuna.trial.TrialState.COMPLETE, "a", measured=True))
    assert verification_left_to(study, a, StopReason.BUDGET, watch) is None
