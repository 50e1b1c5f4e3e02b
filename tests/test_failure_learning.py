"""The search learns from its failures: causes excluded in this worker, in every worker of a
shared study and after a resume; failed trials reach the sampler; hopeless trials are pruned;
the run keeps to its clock. The loop runs for real on a runner that answers from a rule."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from conftest import FIXTURES
from helpers.common import step_measurement

from tpu_tuner import TuneOptions
from tpu_tuner.execution.measurement import EarlyStop, TrialFailure
from tpu_tuner.runner.requests import MeasureRequest
from tpu_tuner.runner.trial_runner import JobResult
from tpu_tuner.studies import records
from tpu_tuner.tuning.options.tune_options import SearchOptions
from tpu_tuner.tuning.run.clock import Clock, plan_finish
from tpu_tuner.tuning.search.failure_learning import stored_causes, stored_not_blamed
from tpu_tuner.tuning.search.pruning import HopelessPruner
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.search.trials import run_search
from tpu_tuner.tuning.search.tuning_trial import TuningTrial

SPACE = SearchSpace.load(FIXTURES / "eager_precision_space.toml", "cpu")
STEP = {"highest": 0.012, "high": 0.008, "medium": 0.003}


class RuleRunner:
    """Answers a measure job by a rule: bf16 autocast crashes the worker; the step follows STEP.
    With `stop`, a job whose threshold its step exceeds 1.5x stops early as the worker would."""

    keeps_warm_steps = True
    workers_started = 1

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds, self.jobs, self.thresholds = seconds, [], []

    def check_usable(self) -> None:
        pass  # the Runner protocol: every job can run here

    def run(self, request: MeasureRequest, env=None, timeout_s=None) -> JobResult:
        self.jobs.append(dict(request.candidate))
        self.thresholds.append(request.stop_above_s)
        time.sleep(self.seconds)
        candidate = request.candidate
        if candidate.get("autocast") == "bfloat16":
            return JobResult(failure=TrialFailure("crash", "worker died from SIGSEGV"), seconds=self.seconds)
        step = STEP[candidate["matmul_precision"]]
        if request.stop_above_s is not None and step > request.stop_above_s:
            return JobResult(
                value=EarlyStop(candidate, "steps", "too slow", [step] * 3, step, 0.0, step), seconds=self.seconds
            )
        return JobResult(value=step_measurement(candidate, step), seconds=self.seconds)


def _search(study: optuna.Study, runner: RuleRunner, trials: int, **search: Any) -> tuple[str, list]:
    events: list = []
    opts = TuneOptions(search=SearchOptions(space=SPACE.name, agents=(), trials=trials, **search))
    end = run_search(study, SPACE, [], runner, MeasureRequest(), opts, events.append, time.perf_counter())
    return end, events


def _bf16_measured(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [
        t for t in study.trials if t.params.get("autocast") == "bfloat16" and records.attrs(t).get(records.MEASURED)
    ]


def _grid_study(storage: str | None = None, name: str = "s") -> optuna.Study:
    from tpu_tuner.studies.samplers import build_sampler

    sampler = build_sampler("grid", 0, settings=SPACE.settings(), grid=SPACE.grid())
    return optuna.create_study(
        study_name=name, storage=storage, sampler=sampler, direction="minimize", load_if_exists=True
    )


def test_a_crashing_value_is_excluded_after_two_failures_and_said(tmp_path: Path) -> None:
    study = _grid_study()
    study.enqueue_trial(SPACE.baseline_params())
    runner = RuleRunner()
    end, events = _search(study, runner, trials=6, prune=False)
    assert end == "covered"
    # Three settings hold bf16: two crashed, the third was never run.
    assert sum(1 for job in runner.jobs if job.get("autocast") == "bfloat16") == 2
    excluded = [t for t in study.trials if records.attrs(t).get(records.EXCLUDED_BY)]
    assert len(excluded) == 1 and excluded[0].params["autocast"] == "bfloat16"
    assert not records.attrs(excluded[0]).get(records.MEASURED)
    said = [e.message for e in events if e.phase == "learn"]
    assert len(said) == 1 and said[0].startswith("autocast bfloat16 excluded after trial ")
    assert "the worker died from SIGSEGV in 2 of 2 settings with it, 0 of " in said[0]
    # Failed trials reach the sampler: told pruned (TPE reads complete and pruned trials) and infeasible.
    for trial in _bf16_measured(study):
        assert trial.state == optuna.trial.TrialState.PRUNED and trial.constraints["failed"] > 0
        assert records.attrs(trial)[records.FAILURE_KIND] == "crash"


def test_the_exclusion_holds_for_another_worker_and_after_a_resume(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    first = _grid_study(storage)
    first.enqueue_trial(SPACE.baseline_params())
    for params in (
        {"matmul_precision": "highest", "autocast": "bfloat16"},
        {"matmul_precision": "high", "autocast": "bfloat16"},
    ):
        first.enqueue_trial(params)
    _search(first, RuleRunner(), trials=3, prune=False)
    (cause,) = stored_causes(first.user_attrs)  # kept in the study, for every worker
    assert cause.key == "autocast=bfloat16"
    # Another worker (a fresh process would read the same storage) and a resumed run: neither
    # measures a bf16 setting, though the space still holds one.
    for name in ("other worker", "resumed"):
        runner = RuleRunner()
        again = optuna.load_study(study_name="s", storage=storage, sampler=optuna.samplers.RandomSampler(seed=1))
        again.enqueue_trial({"matmul_precision": "medium", "autocast": "bfloat16"})
        _search(again, runner, trials=6, prune=False)
        assert all(job.get("autocast") != "bfloat16" for job in runner.jobs), name
    assert len(_bf16_measured(optuna.load_study(study_name="s", storage=storage))) == 2
    # `tpu-tune study status` lists the cause.
    from tpu_tuner.tuning.run.shared_study import RECORD_ATTR
    from tpu_tuner.tuning.run.study_admin import study_status

    first.set_user_attr(RECORD_ATTR, {"options": {"trials": 6}})
    lines = "\n".join(study_status(storage, "s").lines())
    assert "  excluded  autocast bfloat16 excluded after trial " in lines


def test_the_stored_causes_are_read_when_failures_are_new_or_a_while_passed(monkeypatch) -> None:
    """Another worker stores a cause once it has seen failures: a round whose trials hold no new
    failure needs no read of the study's attributes (a storage transaction) but every
    `CAUSES_REREAD_S`."""
    from tpu_tuner.tuning.search import failure_learning

    study = _grid_study()
    reads = []
    real = optuna.Study.user_attrs
    monkeypatch.setattr(optuna.Study, "user_attrs", property(lambda self: reads.append(1) or real.fget(self)))
    learning = failure_learning.FailureLearning(SPACE, 0.1)
    trial = study.ask()
    trial.suggest_categorical("autocast", ["none", "bfloat16"])
    study.tell(trial, 1.0)
    for _ in range(3):
        learning.update(study, TuningTrial.all(study.get_trials()))
    assert reads == [1]
    crashed = study.ask()
    crashed.set_user_attr(records.RECORD, {records.MEASURED: True, records.FAILURE_KIND: "crash"})
    study.tell(crashed, state=optuna.trial.TrialState.PRUNED)
    learning.update(study, TuningTrial.all(study.get_trials()))
    learning.update(study, TuningTrial.all(study.get_trials()))
    assert reads == [1, 1]
    monkeypatch.setattr(failure_learning, "CAUSES_REREAD_S", 0.0)
    learning.update(study, TuningTrial.all(study.get_trials()))
    assert reads == [1, 1, 1]


def test_tpe_never_proposes_an_excluded_value() -> None:
    from tpu_tuner.studies.samplers import build_sampler

    study = optuna.create_study(direction="minimize", sampler=build_sampler("tpe", 3, startup_trials=2))
    study.enqueue_trial(SPACE.baseline_params())
    study.enqueue_trial({"matmul_precision": "high", "autocast": "bfloat16"})
    study.enqueue_trial({"matmul_precision": "medium", "autocast": "bfloat16"})
    runner = RuleRunner()
    _search(study, runner, trials=5, prune=False)
    after = [t for t in study.trials if t.number > 2]
    # Redrawn by the sampler: no ask after the exclusion even holds bf16 (none told unmeasured).
    assert after and all(t.params.get("autocast") != "bfloat16" for t in after)


def test_a_hopeless_trial_is_pruned_through_the_pruner_interface() -> None:
    study = optuna.create_study(direction="minimize", pruner=HopelessPruner())
    for precision in ("medium", "highest"):
        study.enqueue_trial({"matmul_precision": precision, "autocast": "none"})
    runner = RuleRunner()
    _search(study, runner, trials=2)
    best, slow = study.trials
    assert best.state == optuna.trial.TrialState.COMPLETE
    # 12 ms against a best of 3 ms: beyond 1.5x, stopped with what it measured, reported to Optuna.
    assert slow.state == optuna.trial.TrialState.PRUNED
    assert records.attrs(slow)[records.STOPPED_EARLY] == "too slow"
    assert slow.intermediate_values == {3: pytest.approx(0.012)}
    assert records.attrs(slow)[records.EARLY_STOP]["steps"] == [0.012] * 3
    assert HopelessPruner().threshold(TuningTrial.all(study.trials)) == pytest.approx(1.5 * 0.003)


def test_a_setting_that_can_settle_a_suspect_is_measured_to_its_verdict() -> None:
    """After one crash with bf16 (no success with it), the next bf16 setting runs without the
    early stop: cut off (its compile or first steps) it would spend a trial and settle nothing."""
    study = optuna.create_study(direction="minimize", pruner=HopelessPruner())
    for precision, autocast in (
        ("medium", "none"),
        ("highest", "bfloat16"),
        ("high", "bfloat16"),
        ("highest", "none"),
        ("medium", "bfloat16"),
    ):
        study.enqueue_trial({"matmul_precision": precision, "autocast": autocast})
    runner, events = RuleRunner(), []
    opts = TuneOptions(search=SearchOptions(space=SPACE.name, agents=(), trials=5))
    run_search(study, SPACE, [], runner, MeasureRequest(), opts, events.append, time.perf_counter())
    # The first bf16 setting ran under the pruner's threshold, the second (its suspect open) without;
    # its crash made bf16 the cause, and the third was never measured.
    jobs = list(zip(runner.jobs, runner.thresholds))
    assert [(job["matmul_precision"], job["autocast"]) for job, _ in jobs[:4]] == [
        ("medium", "none"),
        ("highest", "bfloat16"),
        ("high", "bfloat16"),
        ("highest", "none"),
    ]
    assert jobs[1][1] == pytest.approx(1.5 * 0.003) and jobs[2][1] is None
    assert jobs[3][1] == pytest.approx(1.5 * 0.003)  # an fp32 setting holds no suspect: the stop applies
    running = [e.message for e in events if e.phase == "trial" and e.message.startswith("running")]
    assert "to its verdict: autocast bfloat16 failed in trial 1 (crash) and never worked" in running[2]
    assert "verdict" not in running[1] + running[3]
    assert [t.params["autocast"] for t in study.trials if records.attrs(t).get(records.EXCLUDED_BY)] == ["bfloat16"]


def test_only_single_values_lift_the_early_stop() -> None:
    """One failure leaves every pair of its values that no success held open; those do not lift
    the stop (they would from most settings after any failure), single values do."""
    from tpu_tuner.tuning.search.failure_learning import FailureLearning

    study = optuna.create_study(direction="minimize")
    for params, attrs in (
        ({"matmul_precision": "medium", "autocast": "none"}, {}),
        ({"matmul_precision": "highest", "autocast": "bfloat16"}, {records.FAILURE_KIND: "crash"}),
        ({"matmul_precision": "highest", "autocast": "none"}, {}),
        ({"matmul_precision": "medium", "autocast": "bfloat16"}, {}),
    ):
        study.enqueue_trial(params)
        trial = study.ask()
        trial.suggest_categorical("matmul_precision", ["highest", "high", "medium"])
        trial.suggest_categorical("autocast", ["none", "bfloat16"])
        trial.set_user_attr(records.RECORD, {records.MEASURED: True, **attrs})
        study.tell(trial, None if attrs else 0.01, state=None if not attrs else optuna.trial.TrialState.PRUNED)
    learning = FailureLearning(SPACE, 0.1)
    learning.update(study, TuningTrial.all(study.get_trials()))
    # highest and bf16 each worked once: only their pair is open, and it lifts nothing.
    assert learning.suspects == []
    assert learning.open_suspects_in({"matmul_precision": "highest", "autocast": "bfloat16"}) == []


class ChipRunner(RuleRunner):
    """Issue 54's chip: the default precision (autocast none, the baseline's) fails the accuracy
    check; with `fault`, every job fails with the device's error instead."""

    def __init__(self, fault: bool = False) -> None:
        super().__init__()
        self.fault = fault

    def run(self, request: MeasureRequest, env=None, timeout_s=None) -> JobResult:
        self.jobs.append(dict(request.candidate))
        if self.fault:
            failure = TrialFailure("error", "RuntimeError: a required argument is in a failed state")
            return JobResult(failure=failure, seconds=0.0)
        measurement = step_measurement(request.candidate, STEP[request.candidate["matmul_precision"]])
        if request.candidate.get("autocast") == "none":
            measurement.accuracy_errors = {"output": 0.5}
        return JobResult(value=measurement, seconds=0.0)


def test_a_failure_the_baseline_shares_excludes_nothing_and_is_said() -> None:
    study = _grid_study()
    study.enqueue_trial(SPACE.baseline_params())
    runner = ChipRunner()
    _, events = _search(study, runner, trials=6, prune=False)
    # Every setting measured: autocast none (three failures, no success with it) is not excluded.
    assert len(runner.jobs) == 6
    assert not [t for t in study.trials if records.attrs(t).get(records.EXCLUDED_BY)]
    said = [e.message for e in events if e.phase == "learn"]
    assert said == [
        "the baseline (trial 0) fails with accuracy too (the accuracy check failed): not blamed on any knob "
        "value; 1 of 1 settings failed with it, up to trial 0"
    ]
    # Kept in the study, beside (instead of) the causes.
    assert stored_causes(study.user_attrs) == []
    assert [(n.kind, n.baseline_trial) for n in stored_not_blamed(study.user_attrs)] == [("accuracy", 0)]


def _told(study: optuna.Study, precision: str, autocast: str, error: float) -> None:
    study.enqueue_trial({"matmul_precision": precision, "autocast": autocast})
    trial = study.ask()
    trial.suggest_categorical("matmul_precision", ["highest", "high", "medium"])
    trial.suggest_categorical("autocast", ["none", "bfloat16"])
    trial.set_user_attr(records.RECORD, {records.MEASURED: True, records.ACCURACY_ERROR: error})
    study.tell(trial, 0.01)


def test_a_cause_found_before_the_baseline_failed_with_its_kind_is_lifted() -> None:
    """Settings measured before the baseline's verdict (another worker's, or queued first) made
    autocast none a cause; the baseline then fails the same check: the cause is lifted, here and
    in the study's record, and said."""
    from tpu_tuner.tuning.search.failure_learning import FailureLearning

    study = optuna.create_study(direction="minimize")
    for precision, autocast, error in (("medium", "none", 0.5), ("high", "none", 0.5), ("high", "bfloat16", 0.0)):
        _told(study, precision, autocast, error)
    learning = FailureLearning(SPACE, 0.1)
    (cause,) = learning.update(study, TuningTrial.all(study.get_trials()))
    baseline = SPACE.complete(SPACE.baseline_params())
    assert cause.key == "autocast=none" and learning.excluded_by(baseline) is cause
    _told(study, "highest", "none", 0.5)  # the baseline
    (note,) = learning.update(study, TuningTrial.all(study.get_trials()))
    assert note.describe().startswith("the baseline (trial 3) fails with accuracy too")
    assert learning.excluded_by(baseline) is None and learning.causes == {}
    assert stored_causes(study.user_attrs) == []
    assert learning.update(study, TuningTrial.all(study.get_trials())) == []  # said once


def test_a_device_fault_of_every_setting_excludes_nothing() -> None:
    study = _grid_study()
    for precision, autocast in (("high", "none"), ("medium", "none"), ("medium", "bfloat16")):
        study.enqueue_trial({"matmul_precision": precision, "autocast": autocast})
    runner = ChipRunner(fault=True)
    _, events = _search(study, runner, trials=3, prune=False)
    assert len(runner.jobs) == 3
    assert not [t for t in study.trials if records.attrs(t).get(records.EXCLUDED_BY)]
    (said,) = [e.message for e in events if e.phase == "learn"]
    assert said.startswith("error in every setting so far (the step failed (RuntimeError: a required argument")
    assert "not blamed on any knob value until a setting gets past it" in said
    assert stored_causes(study.user_attrs) == stored_not_blamed(study.user_attrs) == []


def test_the_search_stops_when_the_next_trial_would_eat_into_the_finish(monkeypatch) -> None:
    from tpu_tuner.tuning.run import clock

    monkeypatch.setattr(clock, "WRAP_UP_S", 0.0)  # no results to write here
    study = _grid_study()
    study.enqueue_trial(SPACE.baseline_params())
    runner = RuleRunner(seconds=0.4)
    end, events = _search(study, runner, trials=6, prune=False, time_budget_s=1.0)
    assert end == "clock"
    assert 1 <= len(runner.jobs) <= 3
    lefts = [e.time_left for e in events if e.phase == "trial"]
    assert lefts and all(left is not None and left <= 1.0 for left in lefts)


def test_the_finish_shrinks_to_the_time_left() -> None:
    study = optuna.create_study(direction="minimize")
    for step in (0.4, 0.2, 0.21, 0.22, 0.25, 0.3):
        trial = study.ask()
        for key, value in ((records.STEP_MEDIAN_S, step), (records.COMPILE_S, 20.0), (records.FEASIBLE, True)):
            trial.set_user_attr(key, value)
        study.tell(trial, step)
    trials = TuningTrial.all(study.trials)
    full = plan_finish(trials, 5, 12, None)
    assert (full.race_top, full.verify_rounds, full.ablations) == (5, 12, True)
    smaller = plan_finish(trials, 5, 12, full.seconds / 2)
    assert smaller.seconds <= full.seconds / 2 and smaller.race_top < 5
    tiny = plan_finish(trials, 5, 12, 0.0)
    assert (tiny.race_top, tiny.verify_rounds, tiny.ablations) == (0, 4, False)
    assert Clock(None, time.perf_counter()).left() is None
