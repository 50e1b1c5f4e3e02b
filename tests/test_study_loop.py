"""The studies' one ask/tell loop (studies/loop.py) with a scripted feature: the budget, repeats
answered from earlier trials, release past the budget, caps on asks, the queue, and claims
settled between two workers of one SQLite study. No model, no worker process: fast."""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Sequence
from dataclasses import fields
from typing import Any

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from tpu_tuner.runner.requests import MeasureRequest
from tpu_tuner.studies import records
from tpu_tuner.studies.liveness import Worker, open_storage
from tpu_tuner.studies.loop import Claim, Feature, Rules, Settled, StopReason, run_loop, settle
from tpu_tuner.studies.samplers import SettingsGrid, build_sampler
from tpu_tuner.tuning import TuneOptions
from tpu_tuner.tuning.options.tune_options import SearchOptions
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.search.trials import TuneTrials

optuna.logging.set_verbosity(optuna.logging.WARNING)
KEYS = [f"s{i}" for i in range(10)]


class Scripted(Feature):
    """A feature whose trial holds one categorical setting `x`; evaluating it returns its index,
    after `delay_s`. Keys in `invalid` are ruled out before any claim."""

    def __init__(self, worker: str = "w", delay_s: float = 0.0, invalid: Sequence[str] = ()) -> None:
        self.worker, self.delay_s, self.invalid = worker, delay_s, set(invalid)
        self.evaluated: list[str] = []
        self.batches: list[int] = []
        self.waited = 0

    def begin(self, trial: optuna.Trial) -> tuple[Hashable, Any] | None:
        trial.set_user_attr(records.WORKER, self.worker)
        x = trial.suggest_categorical("x", KEYS)
        if x in self.invalid:
            trial.set_user_attr(records.REJECTED_BY, "invalid")
            trial.study.tell(trial, state=TrialState.PRUNED)
            return None
        return x, x

    def key_of(self, trial: FrozenTrial) -> Hashable | None:
        return trial.params.get("x")

    def settled(self, trials: Sequence[FrozenTrial]) -> dict[Hashable, FrozenTrial]:
        return {
            t.params["x"]: t for t in trials if t.state == TrialState.COMPLETE and records.REPEAT_OF not in t.user_attrs
        }

    def tell_settled(self, trial: optuna.Trial, how: Settled, other: FrozenTrial | None) -> None:
        if how is Settled.REPEAT and other is not None:
            trial.set_user_attr(records.REPEAT_OF, other.number)
            trial.study.tell(trial, other.value)
            return
        if how is Settled.IN_FLIGHT and other is not None:
            trial.set_user_attr(records.REPEAT_OF, other.number)
            trial.set_user_attr(records.IN_FLIGHT_ELSEWHERE, True)
        else:
            trial.set_user_attr(records.OVER_BUDGET, True)
        trial.study.tell(trial, state=TrialState.PRUNED)

    def evaluate(self, claims: list[Claim]) -> list[Any]:
        self.batches.append(len(claims))
        time.sleep(self.delay_s)
        self.evaluated += [c.point for c in claims]
        return [float(KEYS.index(c.point)) for c in claims]

    def tell(self, claim: Claim, result: Any) -> None:
        claim.trial.study.tell(claim.trial, result)

    def waiting(self, spent: int, running: int) -> None:
        self.waited += 1


def _worker(storage: Any = None) -> Worker:
    return Worker("w", "h", storage, poll_s=0.01)


def _tune_trials(study: optuna.Study, space: SearchSpace, storage: Any) -> TuneTrials:
    """The tuner's feature on `study`, with no agents and no runner: only its claims are settled."""
    return TuneTrials(
        study,
        space,
        [],
        None,  # type: ignore[arg-type]
        MeasureRequest(),
        TuneOptions(search=SearchOptions(trials=5)),
        lambda event: None,
        0.0,
        None,
        None,
        Worker("a", "h", storage),
    )


def test_the_budget_counts_evaluated_settings_and_repeats_are_answered_not_evaluated() -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.enqueue_trial({"x": "s1"})
    study.enqueue_trial({"x": "s1"})  # the same setting again: a repeat
    feature = Scripted()
    end = run_loop(study, feature, Rules(budget=4), _worker())
    assert end.reason == "budget" and end.spent == 4
    assert len(feature.evaluated) == len(set(feature.evaluated)) == 4
    repeat = study.get_trials(deepcopy=False)[1]
    assert repeat.user_attrs[records.REPEAT_OF] == 0 and repeat.value == 1.0


def test_claims_evaluate_in_batches_up_to_the_budget() -> None:
    study = optuna.create_study(sampler=SettingsGrid([{"x": k} for k in KEYS], {"x": KEYS}, seed=0))
    feature = Scripted()
    end = run_loop(study, feature, Rules(budget=7, batch=3), _worker())
    assert end.reason == "budget" and feature.batches == [3, 3, 1]
    assert sorted(feature.evaluated) == sorted(set(feature.evaluated))
    positions_told = [t.number for t in study.get_trials() if t.state == TrialState.COMPLETE]
    assert len(positions_told) == 7


def test_running_trials_that_hold_the_budget_are_spent_or_waited_for() -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    study.enqueue_trial({"x": "s0"})
    done = study.ask()
    done.suggest_categorical("x", KEYS)
    study.tell(done, 0.0)
    study.enqueue_trial({"x": "s2"})
    running = study.ask()  # another worker's, still evaluating: with it the budget of 2 is spoken for
    running.suggest_categorical("x", KEYS)
    study.enqueue_trial({"x": "s3"})
    feature = Scripted()
    end = run_loop(study, feature, Rules(budget=2, wait_for_running=False), _worker())
    assert end.reason == "budget" and end.spent == 2 and feature.evaluated == []
    assert running.number == 1
    # Waiting instead: the loop waits for the running trial, which is then told by its worker.
    waiting = Scripted()
    threading.Timer(0.2, lambda: study.tell(running, 2.0)).start()
    end = run_loop(study, waiting, Rules(budget=2), _worker())
    assert end.reason == "budget" and waiting.waited == 1 and waiting.evaluated == []


def test_a_worker_waits_when_running_trials_measure_every_setting_left() -> None:
    """The space's last unsettled setting is being measured by another worker: asking would only
    make trials answered "in flight elsewhere" (a chaos study recorded 309 trials for 4 settings);
    the loop waits, and stops covered once that trial is told."""
    space = KEYS[:2]
    study = optuna.create_study(sampler=SettingsGrid([{"x": k} for k in space], {"x": space}, seed=0))
    study.enqueue_trial({"x": "s0"})
    done = study.ask()
    done.suggest_categorical("x", KEYS)
    study.tell(done, 0.0)
    study.enqueue_trial({"x": "s1"})
    running = study.ask()  # another worker's
    running.suggest_categorical("x", KEYS)
    feature = Scripted()
    threading.Timer(0.3, lambda: study.tell(running, 1.0)).start()
    end = run_loop(study, feature, Rules(budget=5, space_size=2, max_asks=50), _worker())
    assert end.reason == "covered" and feature.waited == 1 and feature.evaluated == []
    assert len(study.get_trials()) == 2  # no trial asked while it waited


def test_a_late_trial_is_released_and_an_in_flight_setting_left_to_its_trial() -> None:
    from tpu_tuner.studies.loop import settle

    study = optuna.create_study()
    study.enqueue_trial({"x": "s4"})
    study.ask().suggest_categorical("x", KEYS)
    study.enqueue_trial({"x": "s4"})
    same = study.ask()
    assert settle(study, Scripted(), Rules(budget=5), same, []) is Settled.IN_FLIGHT
    assert study.get_trials()[same.number].user_attrs[records.IN_FLIGHT_ELSEWHERE]
    study.enqueue_trial({"x": "s5"})
    late = study.ask()
    assert settle(study, Scripted(), Rules(budget=1), late, []) is Settled.RELEASED
    assert study.get_trials()[late.number].user_attrs[records.OVER_BUDGET]
    study.enqueue_trial({"x": "s6"})
    claim = settle(study, Scripted(), Rules(budget=5), study.ask(), [])
    assert isinstance(claim, Claim) and claim.position == 1 and claim.key == "s6"


@pytest.mark.parametrize(
    "rules, reason", [(Rules(budget=5, max_idle_asks=6), "idle"), (Rules(budget=5, max_asks=4), "asks")]
)
def test_asks_without_a_claim_are_capped(rules: Rules, reason: str) -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=2))
    end = run_loop(study, Scripted(invalid=KEYS), rules, _worker())
    assert end.reason == reason and end.spent == 0


def test_a_grid_walks_every_setting_once_and_coverage_stops_the_loop() -> None:
    study = optuna.create_study(sampler=build_sampler("grid", 0, settings=[{"x": k} for k in KEYS], grid={"x": KEYS}))
    feature = Scripted()
    end = run_loop(study, feature, Rules(budget=100, batch=2, space_size=len(KEYS)), _worker())
    assert end.reason == "covered" and sorted(feature.evaluated) == sorted(KEYS)


def test_two_workers_on_one_sqlite_study_evaluate_the_budget_each_setting_once(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'loop.db'}"
    optuna.create_study(study_name="shared", storage=open_storage(url, interval_s=1))
    features = [Scripted(worker=name, delay_s=0.05) for name in ("a", "b")]
    ends = []

    def work(feature: Scripted, seed: int) -> None:
        storage = open_storage(url, interval_s=1)
        study = optuna.load_study(
            study_name="shared",
            storage=storage,
            sampler=build_sampler("grid", 0, settings=[{"x": k} for k in KEYS], grid={"x": KEYS}),
        )
        ends.append(run_loop(study, feature, Rules(budget=6), Worker(feature.worker, "h", storage, poll_s=0.02)))

    threads = [threading.Thread(target=work, args=(f, i)) for i, f in enumerate(features)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert [e.reason for e in ends] == ["budget", "budget"]
    evaluated = features[0].evaluated + features[1].evaluated
    assert len(evaluated) == len(set(evaluated)) == 6
    study = optuna.load_study(study_name="shared", storage=url)
    complete = [
        t for t in study.get_trials() if t.state == TrialState.COMPLETE and records.REPEAT_OF not in t.user_attrs
    ]
    assert len(complete) == 6 and not [t for t in study.get_trials() if t.state == TrialState.RUNNING]


def test_the_grid_walks_every_setting_once_in_the_order_its_seed_gives() -> None:
    settings = [{"x": k} for k in KEYS]
    walks = []
    for _ in range(2):
        study = optuna.create_study(sampler=build_sampler("grid", 3, settings=settings, grid={"x": KEYS}))
        walk = []
        for _ in KEYS:
            trial = study.ask()
            walk.append(trial.suggest_categorical("x", KEYS))
            study.tell(trial, 0.0)
        walks.append(walk)
    assert walks[0] == walks[1] and sorted(walks[0]) == sorted(KEYS)


def test_a_setting_another_worker_settled_while_this_one_suggested_it_is_a_repeat(tmp_path) -> None:
    """The read after the ask sees trials asked after this one: another worker's later trial
    may settle the same setting while this worker's suggest is slow (in a 2-worker benchmark,
    TPE proposed trial 0 the setting that trial 1 had already measured). The round's read
    before the ask holds no such trial, so it cannot stand in for the read after it."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    space = SearchSpace.load("default", "cpu")
    setting = space.baseline_params()
    storage = open_storage(url, 1)
    study = optuna.create_study(storage=storage, study_name="s")
    feature = _tune_trials(study, space, storage)
    study.enqueue_trial(setting)
    mine = study.ask()  # trial 0, whose setting is suggested below
    other = optuna.load_study(study_name="s", storage=open_storage(url, 1))  # another worker
    other.enqueue_trial(setting)
    theirs = other.ask()
    space.suggest(theirs)
    theirs.set_user_attr(records.RECORD, {records.MEASURED: True, records.FEASIBLE: True})
    other.tell(theirs, 1.0)
    assert theirs.number == 1
    assert settle(study, feature, Rules(budget=5), mine, []) is Settled.REPEAT
    assert records.attrs(study.get_trials()[0])[records.REPEAT_OF] == 1


def test_an_earlier_trial_still_writing_the_same_setting_is_waited_for_and_measures_it(tmp_path) -> None:
    """Two workers asked at once for one setting (the chaos benchmark's fault-free study measured
    it twice): the later trial read the earlier's setting half written, saw no match, and measured
    it too, while the earlier one never looks at later trials. The later one now waits until the
    earlier trial's whole setting and claim are written, and leaves the setting to it."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    space = SearchSpace.load("default", "cpu")
    setting = space.baseline_params()
    storage = open_storage(url, 1)
    study = optuna.create_study(storage=storage, study_name="s")
    other = optuna.load_study(study_name="s", storage=open_storage(url, 1))  # another worker
    other.enqueue_trial(setting)
    theirs = other.ask()  # trial 0: its worker has written one parameter of several so far
    first = space.searched[0]
    theirs.suggest_categorical(first.name, list(first.choices))
    feature = _tune_trials(study, space, storage)
    study.enqueue_trial(setting)
    mine = study.ask()
    assert mine.number == 1 and len(setting) > 1

    def finish_writing() -> None:
        space.suggest(theirs)
        theirs.set_user_attr(records.RECORD, {records.WORKER: "b", records.HOST: "h"})

    threading.Timer(0.3, finish_writing).start()
    assert settle(study, feature, Rules(budget=5), mine, []) is Settled.IN_FLIGHT
    assert records.attrs(study.get_trials()[1])[records.REPEAT_OF] == 0


def test_a_trial_failed_as_lost_before_its_setting_is_written_is_skipped_and_the_loop_goes_on(tmp_path, caplog) -> None:
    """Another worker fails the trial (as the lost-trial check does) between its ask and its
    claim: the storage refuses the claim's write; the loop logs it, evaluates nothing for it, and
    still meets its budget."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    storage = open_storage(url, 1)
    study = optuna.create_study(storage=storage, study_name="lost", sampler=optuna.samplers.RandomSampler(seed=0))
    other = optuna.storages.RDBStorage(url)  # another worker's view

    class FailedMeanwhile(Scripted):
        def begin(self, trial: optuna.Trial) -> tuple[Hashable, Any] | None:
            if trial.number == 0:
                other.set_trial_state_values(
                    other.get_trial_id_from_study_id_trial_number(other.get_study_id_from_name("lost"), 0),
                    TrialState.FAIL,
                )
            begun = super().begin(trial)
            return begun

    feature = FailedMeanwhile()
    with caplog.at_level("WARNING", logger="tpu_tuner.studies.loop"):
        end = run_loop(study, feature, Rules(budget=3), _worker(storage))
    assert end.reason == "budget" and end.spent == 3 and len(feature.evaluated) == 3
    first = optuna.load_study(study_name="lost", storage=url).get_trials()[0]
    assert first.state == TrialState.FAIL and records.WORKER not in first.user_attrs  # its claim refused
    assert "trial 0 was failed as lost by another worker before it was evaluated here" in caplog.text


def test_the_loop_keeps_no_clock_of_its_own_the_features_stop_is_the_one_deadline() -> None:
    """Issue 58: two time stops (the loop's `Rules.timeout_s` from a start that defaulted to 0,
    and the feature's clock) are one: the feature's `stop_reason`, read before every round."""
    study = optuna.create_study()

    class Stopping(Scripted):
        def stop_reason(self) -> StopReason | None:
            return StopReason.CLOCK if len(self.evaluated) >= 2 else None

    end = run_loop(study, Stopping(), Rules(budget=4), _worker())
    assert end.reason == StopReason.CLOCK and end.spent == 2
    assert "timeout_s" not in {f.name for f in fields(Rules)}
