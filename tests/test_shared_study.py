"""A study shared by name, without a model: joining and its refusals (tuning/shared_study.py), and
liveness (tuning/liveness.py): a trial whose heartbeat stops is failed as lost and queued again,
a beating one is left alone. On SQLite files in a temporary folder (the PostgreSQL server runs
the whole thing in test_many_workers.py)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path

import optuna
import pytest

from conftest import FIXTURES
from tpu_tuner.errors import UserInputError
from tpu_tuner.search.space import SearchSpace
from tpu_tuner.tuning import liveness
from tpu_tuner.tuning.liveness import Heartbeat, fail_lost_trials, is_lost, open_storage
from tpu_tuner.tuning.options import TuneOptions
from tpu_tuner.tuning.shared_study import adopt_options, join_differences, make_record, open_shared

SPACE = SearchSpace.load(FIXTURES / "eager_precision_space.toml", "cpu")
FINGERPRINT = {"model_file": "/host-a/gpt.py", "sha256": "a" * 64, "convention": "native", "step_kind": "training",
               "inputs": [[[8, 256], "int64"]], "batch_size": 8, "seq_len": 256, "device_kind": "cpu",
               "device_name": "AMD EPYC", "nproc": 1, "versions": {"torch": "2.13.0", "optuna": "5.0.0"}}


def _storage(tmp_path: Path, interval: int = 1, grace: int | None = 2) -> optuna.storages.RDBStorage:
    return open_storage(f"sqlite:///{tmp_path / 'studies.db'}", interval, grace)


def test_a_second_worker_joins_and_adopts_the_study_budget(tmp_path) -> None:
    storage = _storage(tmp_path)
    first = open_shared(storage, "s", optuna.samplers.RandomSampler(),
                        make_record(FINGERPRINT, SPACE, TuneOptions(trials=7, planned_steps=100)), SPACE)
    # Another host: the file lies elsewhere and the CPU has another name; same workload.
    elsewhere = {**FINGERPRINT, "model_file": "/host-b/gpt.py", "device_name": "Intel Xeon"}
    second = open_shared(storage, "s", optuna.samplers.RandomSampler(),
                         make_record(elsewhere, SPACE, TuneOptions(trials=3)), SPACE)
    assert first.created and not second.created
    adopted = adopt_options(TuneOptions(trials=3, planned_steps=5000), second.record)
    assert adopted.trials == 7 and adopted.planned_steps == 100


@pytest.mark.parametrize("change, words", [
    ({"sha256": "b" * 64}, "model file differs"),
    ({"batch_size": 16}, "--batch-size differs"),
    ({"device_kind": "cuda"}, "device kind differs"),
])
def test_a_worker_with_another_workload_is_refused_in_one_line(tmp_path, change, words) -> None:
    storage = _storage(tmp_path)
    open_shared(storage, "s", optuna.samplers.RandomSampler(), make_record(FINGERPRINT, SPACE, TuneOptions()), SPACE)
    with pytest.raises(UserInputError, match=f"--study s: join refused: {words}") as info:
        open_shared(storage, "s", optuna.samplers.RandomSampler(),
                    make_record({**FINGERPRINT, **change}, SPACE, TuneOptions()), SPACE)
    assert len(str(info.value).splitlines()) == 1


def test_a_worker_with_another_space_is_refused() -> None:
    other = SearchSpace.load("default", "cpu")
    found = join_differences(make_record(FINGERPRINT, SPACE, TuneOptions()), FINGERPRINT, other)
    assert len(found) == 1 and found[0].startswith("search space differs ('default': parameters ")


def test_a_study_not_made_by_tpu_tune_is_refused_after_waiting(tmp_path) -> None:
    storage = _storage(tmp_path)
    optuna.create_study(storage=storage, study_name="theirs")
    with pytest.raises(UserInputError, match="not created by tpu-tune"):
        open_shared(storage, "theirs", optuna.samplers.RandomSampler(),
                    make_record(FINGERPRINT, SPACE, TuneOptions()), SPACE, wait_s=0.5)


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
        time.sleep(3.2)  # past the grace period of the stopped one
        fail_lost_trials(study, storage)
        states = {t.number: t for t in study.get_trials(deepcopy=False)}
        assert states[alive.number].state == optuna.trial.TrialState.RUNNING
    assert is_lost(states[lost.number])
    retry = [t for t in states.values() if t.system_attrs.get("failed_trial") == lost.number]
    assert len(retry) == 1 and retry[0].state == optuna.trial.TrialState.WAITING
    assert retry[0].params == states[lost.number].params
    study.tell(alive, 1.0)


def test_a_trial_that_never_beat_is_failed_once_old(tmp_path, monkeypatch) -> None:
    storage = _storage(tmp_path, interval=1, grace=2)
    study = optuna.create_study(storage=storage, study_name="s")
    orphan = study.ask()  # its worker died before its first beat and before naming itself
    fail_lost_trials(study, storage)
    assert study.get_trials(deepcopy=False)[0].state == optuna.trial.TrialState.RUNNING  # young: left alone

    class _Later(datetime):
        @classmethod
        def now(cls, tz=None):  # type: ignore[override]
            return datetime.now(tz) + timedelta(seconds=60)

    monkeypatch.setattr(liveness, "datetime", _Later)
    fail_lost_trials(study, storage)
    assert is_lost(study.get_trials(deepcopy=False)[orphan.number])
