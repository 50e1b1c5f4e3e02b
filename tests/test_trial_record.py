"""A tuning trial's record as one structured user attribute (issue 26, req. 5): written the new way
it reads back with every key and value the old way (one attribute per key) stored; a study of an
earlier version still reads through `records.attrs` and every reader built on it; and a trial
costs a small, fixed number of attribute writes and whole-study reads, so the saving cannot
silently regress."""

from __future__ import annotations

from typing import Any

import optuna
import pytest
from helpers.common import RECORD_BUDGET, RECORD_SETTINGS, recorded_search

from tpu_tuner.studies import records
from tpu_tuner.studies.coverage import covered_settings, last_measured, measured_count
from tpu_tuner.studies.liveness import is_lost, trial_id_of
from tpu_tuner.studies.trial_costs import COST_KEYS
from tpu_tuner.studies.trial_record import TrialRecord, write_stored
from tpu_tuner.tuning.search.tuning_trial import TuningTrial

optuna.logging.set_verbosity(optuna.logging.WARNING)


class CountingStorage(optuna.storages.InMemoryStorage):
    """The in-memory storage, counting the attribute writes of each trial."""

    def __init__(self) -> None:
        super().__init__()
        self.user_attr_writes: dict[int, int] = {}

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        self.user_attr_writes[trial_id] = self.user_attr_writes.get(trial_id, 0) + 1
        super().set_trial_user_attr(trial_id, key, value)


def _flat_flush(self: TrialRecord) -> None:
    """How versions before the structured record stored a trial: one user attribute per key."""
    for key, value in self.values().items():
        self.trial.set_user_attr(key, value)


@pytest.fixture(scope="module")
def studies() -> tuple[optuna.Study, optuna.Study]:
    """The same search stored the new way and the old way."""
    new = recorded_search()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TrialRecord, "flush", _flat_flush)
        old = recorded_search()
    return new, old


def test_the_record_is_one_attribute_and_reads_back_as_every_key_of_the_old_way(studies) -> None:
    new, old = studies
    new_trials, old_trials = new.get_trials(), old.get_trials()
    assert len(new_trials) == len(old_trials) == len(RECORD_SETTINGS)
    for n, o in zip(new_trials, old_trials):
        assert set(n.user_attrs) == {records.RECORD}  # one attribute
        assert records.RECORD not in o.user_attrs
        assert dict(records.attrs(n)) == o.user_attrs, n.number
        assert (n.state, n.value, n.constraints) == (o.state, o.value, o.constraints)
    measured, repeat, rejected, inaccurate, failed = (records.attrs(t) for t in new_trials)
    assert set(measured) == {
        records.WORKER,
        records.HOST,
        records.MEASURED,
        records.TRIAL_WALL_S,
        records.MEASUREMENT,
        records.STEP_MEDIAN_S,
        records.COMPILE_S,
        records.AMORTISED_STEP_S,
        records.MFU,
        records.ACCURACY_ERROR,
        records.PEAK_MEMORY_BYTES,
        records.ESTIMATED_PEAK_BYTES,
        records.ESTIMATE_ERROR,
        records.FEASIBLE,
        records.CANDIDATE,
        *COST_KEYS,  # where its wall time went (issue 56)
        records.START_ENV,  # the start-up variables its worker ran with
    }
    assert measured[records.WORKER] == "worker-1" and measured[records.HOST] == "host-1" and measured[records.FEASIBLE]
    # A repeat carries its first trial's figures, but says who asked for it, not who measured.
    assert repeat[records.REPEAT_OF] == 0 and repeat[records.WORKER] == "worker-1"
    assert records.MEASUREMENT not in repeat and repeat[records.STEP_MEDIAN_S] == measured[records.STEP_MEDIAN_S]
    assert set(rejected) == {records.WORKER, records.HOST, records.REJECTED_BY}
    assert inaccurate[records.FAILURE_KIND] == "accuracy" and inaccurate[records.FEASIBLE] is False
    assert set(failed) == {
        records.WORKER,
        records.HOST,
        records.MEASURED,
        records.TRIAL_WALL_S,
        records.FAILURE_KIND,
        records.FAILURE_MESSAGE,
        records.FEASIBLE,
        records.START_ENV,
    }


def test_a_study_of_the_old_way_reads_as_the_new_one(studies) -> None:
    new, old = studies
    new_trials, old_trials = new.get_trials(), old.get_trials()
    for n, o in zip(new_trials, old_trials):
        assert records.attrs(o) is o.user_attrs  # nothing to merge: read as stored
        assert TuningTrial.of(n) == TuningTrial.of(o)
        assert is_lost(n) == is_lost(o)
    new_covered, old_covered = covered_settings(new_trials), covered_settings(old_trials)
    assert {k: t.number for k, t in new_covered.items()} == {k: t.number for k, t in old_covered.items()}
    assert measured_count(new_covered) == measured_count(old_covered) == RECORD_BUDGET
    assert last_measured(new_trials).number == last_measured(old_trials).number == 4


def test_flat_keys_and_the_record_merge() -> None:
    """A trial holds flat keys beside its record (a warm start's origin, set when it was queued;
    an older run's keys): both read, the record's winning where both hold a key."""
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage)
    study.enqueue_trial({}, user_attrs={records.WARM_START: {"source": "earlier"}, records.FAILURE_KIND: "stale"})
    trial = study.ask()
    TrialRecord.of(trial).write({records.WORKER: "w"})
    TrialRecord.of(trial).write({records.FAILURE_KIND: "error"})  # the same record: the claim is kept
    stored = study.get_trials()[0]
    assert dict(records.attrs(stored)) == {
        records.WARM_START: {"source": "earlier"},
        records.WORKER: "w",
        records.FAILURE_KIND: "error",
    }
    # A trial another run left RUNNING is annotated through the storage, its record kept.
    write_stored(storage, trial_id_of(storage, study, 0), stored, {records.FAILURE_MESSAGE: "stopped"})
    assert records.attrs(study.get_trials()[0])[records.FAILURE_MESSAGE] == "stopped"
    assert records.attrs(study.get_trials()[0])[records.WORKER] == "w"


def test_a_trial_writes_its_record_twice_and_the_loop_reads_the_study_twice_a_round(monkeypatch) -> None:
    """The claim at the ask and the record before the tell: two attribute writes a trial, whatever
    it holds (13 keys of a measured trial were 13 writes, each a storage transaction); and the
    study read once a round plus once after each ask (the progress lines' best read it twice more
    a trial)."""
    storage = CountingStorage()
    reads = []
    real = optuna.Study.get_trials

    def counted(self: optuna.Study, *args: Any, **kwargs: Any) -> Any:
        reads.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(optuna.Study, "get_trials", counted)
    study = recorded_search(storage)
    trials = study.get_trials()
    reads.pop()
    assert len(trials) == len(RECORD_SETTINGS)
    assert storage.user_attr_writes == {trial_id_of(storage, study, t.number): 2 for t in trials}
    assert len(reads) <= 2 * len(trials) + 1, len(reads)
