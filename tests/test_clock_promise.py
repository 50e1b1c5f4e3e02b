"""Issue 55, item 3: the clock is a promise. A 4-minute run started a max-autotune trial with 92 s
left whose compile took 112 s and ended 20% over. A trial is now skipped when its compile mode took
longer in this search than is left before the finish's room, and a mode not seen yet is stopped
where that room begins; neither is evidence against the setting. On a fake clock: each job moves
it by what the setting takes."""

from __future__ import annotations

import re
from typing import Any

import optuna
import pytest
from conftest import FIXTURES, steady_measurement

from tpu_tuner.core.failures import FailureKind
from tpu_tuner.execution.measurement import TrialFailure
from tpu_tuner.runner.requests import MeasureRequest
from tpu_tuner.runner.trial_runner import JobResult
from tpu_tuner.studies import records
from tpu_tuner.tuning import TuneOptions
from tpu_tuner.tuning.options.tune_options import SearchOptions
from tpu_tuner.tuning.run.clock import WRAP_UP_S, Clock
from tpu_tuner.tuning.search import trials
from tpu_tuner.tuning.search.failure_learning import evidence_of
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.search.tuning_trial import TuningTrial

SPACE = SearchSpace.load(FIXTURES / "compile_precision_space.toml", "cpu")
TAKES = {"eager": 5.0, "inductor": 100.0}  # seconds a trial of each compile mode takes
STEP = 0.010


class Now:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class ClockedRunner:
    """Each measure job moves the fake clock by its mode's time, or stops at its timeout."""

    keeps_warm_steps = True
    workers_started = 1

    def __init__(self, now: Now) -> None:
        self.now, self.jobs = now, []

    def check_usable(self) -> None:
        pass

    def run(self, request: MeasureRequest, env=None, timeout_s=None) -> JobResult:
        candidate = request.candidate
        self.jobs.append((candidate["execution"], candidate["matmul_precision"], timeout_s))
        takes = TAKES[candidate["execution"]]
        if timeout_s is not None and takes > timeout_s:
            self.now.t += timeout_s
            failure = TrialFailure(FailureKind.TIMEOUT, f"no result after {timeout_s:.0f} s; worker killed")
            return JobResult(failure=failure, seconds=timeout_s)
        self.now.t += takes
        m = steady_measurement(
            candidate,
            STEP,
            samples=[STEP] * 10,
            first_call_seconds=takes - 0.1,
            warmup_seconds=0.05,
            compile_seconds=takes - 0.2,
            model_flops_per_step=1e6,
            peak_flops_per_s=1e9,
            accuracy_errors={"output": 0.0},
        )
        return JobResult(value=m, seconds=takes)


def _search(
    monkeypatch, budget_s: float | None, order: list[dict[str, str]]
) -> tuple[optuna.Study, ClockedRunner, Now]:
    now = Now()
    monkeypatch.setattr(trials, "Clock", lambda budget, started: Clock(budget, started, now))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize")
    for params in order:
        study.enqueue_trial(params)
    runner = ClockedRunner(now)
    options = TuneOptions(search=SearchOptions(space=SPACE.name, agents=(), trials=4, time_budget_s=budget_s))
    events: list[Any] = []
    trials.run_search(study, SPACE, [], runner, MeasureRequest(), options, events.append, 0.0)
    return study, runner, now


def _rejection(study: optuna.Study, execution: str, precision: str) -> str | None:
    for t in study.trials:
        if t.params == {"execution": execution, "matmul_precision": precision}:
            return records.attrs(t).get(records.REJECTED_BY)
    raise AssertionError(f"{execution}, {precision} never asked")


def test_a_mode_that_took_longer_than_is_left_is_skipped_unmeasured(monkeypatch) -> None:
    order = [
        {"execution": "eager", "matmul_precision": "highest"},
        {"execution": "inductor", "matmul_precision": "highest"},
        {"execution": "eager", "matmul_precision": "medium"},
        {"execution": "inductor", "matmul_precision": "medium"},
    ]
    study, runner, now = _search(monkeypatch, 240.0, order)
    # 5 + 100 + 5 s measured: 130 s left, 120 s to work, less the finish's room: under 100 s.
    assert [(e, p) for e, p, _ in runner.jobs] == [("eager", "highest"), ("inductor", "highest"), ("eager", "medium")]
    said = _rejection(study, "inductor", "medium")
    assert said is not None and said.startswith("clock: inductor trials took up to 100 s in this search")
    assert now.t <= 240.0 - WRAP_UP_S
    skipped = next(t.number for t in study.trials if records.attrs(t).get(records.REJECTED_BY))
    assert skipped not in [e.number for e in evidence_of(TuningTrial.all(study.trials), 0.01)]  # no evidence against it


def test_a_mode_not_seen_yet_is_stopped_where_the_finish_room_begins(monkeypatch) -> None:
    order = [
        {"execution": "eager", "matmul_precision": "highest"},
        {"execution": "inductor", "matmul_precision": "highest"},
    ]
    study, runner, now = _search(monkeypatch, 60.0, order)
    (_, _, limit) = runner.jobs[1]
    assert limit is not None and limit < TAKES["inductor"]
    said = _rejection(study, "inductor", "highest")
    assert said is not None and said.startswith("clock: stopped after")
    assert now.t <= 60.0 * 1.05  # the run's promise: no more than 5% past the clock
    # Stopped by the clock, not failed: no evidence against inductor, nothing excluded.
    stopped = next(t for t in study.trials if t.params.get("execution") == "inductor")
    assert not records.attrs(stopped).get(records.MEASURED)
    assert [t.number for t in study.trials if records.attrs(t).get(records.EXCLUDED_BY)] == []


def test_without_a_clock_nothing_is_skipped_or_limited(monkeypatch) -> None:
    order = [
        {"execution": "eager", "matmul_precision": "highest"},
        {"execution": "inductor", "matmul_precision": "highest"},
    ]
    _, runner, _ = _search(monkeypatch, None, order)
    assert all(limit is None for _, _, limit in runner.jobs) and len(runner.jobs) == 4


def test_a_search_the_clock_stopped_says_so_with_its_figures(monkeypatch) -> None:
    """An --nproc run stopped after 2 settings with 44 s left and said nothing of why."""
    from tpu_tuner.tuning.run.clock import clock_stop_words

    order = [{"execution": "eager", "matmul_precision": "highest"}]
    study, _, now = _search(monkeypatch, 40.0, order)
    words = clock_stop_words(TuningTrial.all(study.trials), Clock(40.0, 0.0, now))
    left = re.match(
        r"search stopped by the clock with ([\d.]+) s left: the next trial \(about [\d.]+ s, the median", words
    )
    assert left is not None and float(left.group(1)) == pytest.approx(40.0 - now.t, abs=0.05)
    assert "kept for the race and verification" in words


def test_a_clock_that_measured_only_the_baseline_ends_undecided_not_no_gain(monkeypatch) -> None:
    """`--time-budget 100s` on examples/gpt.py measured the baseline only, then printed "no gain:
    no feasible candidate beat the baseline" having compared nothing."""
    from tpu_tuner.metrics.paired import VerdictKind
    from tpu_tuner.profiling.settings import ProfilerSettings
    from tpu_tuner.tuning.options.tune_options import ObjectiveOptions, RunnerOptions
    from tpu_tuner.tuning.verify.verification import verify

    order = [{"execution": "eager", "matmul_precision": "highest"}]
    study, runner, now = _search(monkeypatch, 20.0, order)  # the baseline's 5 s leave no room for more
    assert len(runner.jobs) == 1
    options = TuneOptions(
        search=SearchOptions(space=SPACE.name, agents=(), trials=12, time_budget_s=20.0),
        objective=ObjectiveOptions(verify_rounds=6),
        runner=RunnerOptions(trial_settings=ProfilerSettings()),
    )
    assert now.t < 20.0 - 10.0  # stopped with time held back for the finish: the clock is still the cause
    v = verify(study, SPACE, runner, options, "cpu", clock=Clock(20.0, 0.0, now))  # type: ignore[arg-type]
    assert v.verdict_kind is VerdictKind.UNDECIDED and not v.chosen_is_best
    said = re.fullmatch(
        r"undecided: only the baseline fit in 20\.0 s; about (.+) would measure 12 settings "
        r"\(--time-budget\); keep the baseline",
        v.message,
    )
    assert said is not None and "no gain" not in v.message
    # Seeds queued but never asked (a Llama-class forward pass on a v5e chip, 3 minutes: a 67 s
    # baseline, four seeds waiting) leave the clock the cause: it had read "every other was rejected".
    study.enqueue_trial({"execution": "inductor", "matmul_precision": "highest"})
    study.enqueue_trial({"execution": "eager", "matmul_precision": "high"})
    again = verify(study, SPACE, runner, options, "cpu", clock=Clock(20.0, 0.0, now))  # type: ignore[arg-type]
    assert again.message.startswith("undecided: only the baseline fit in 20.0 s")
    # Without a clock, a search that measured nothing else says so too.
    assert verify(study, SPACE, runner, options, "cpu").message.startswith(
        "undecided: no setting but the baseline was measured"
    )
