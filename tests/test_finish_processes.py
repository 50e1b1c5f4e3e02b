"""The finish's clock where compared settings need processes of their own (issue 54 on a v5e chip).

A Llama-class run on the chip (`--time-budget 8m`): the search stopped where the finish's room
began, 7 minutes in, but the verification compared TorchTPU's DeferAndFuse against the Strict
baseline in processes of their own, three blocks of 4 rounds, each block starting every process
afresh (a trial in a fresh worker had cost 98.8 s beyond compile and steps); the run was still
verifying at 9 min 50 s.
The finish was costed as one worker's builds and rounds. Now a window of processes runs its rounds
in two blocks, and the finish is costed with the process starts the search measured."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from conftest import steady_measurement

from tpu_tuner.profiling.settings import ProfilerSettings
from tpu_tuner.runner.requests import CompareRequest, Comparison
from tpu_tuner.runner.trial_runner import JobResult
from tpu_tuner.studies import records
from tpu_tuner.studies.trial_record import TrialRecord
from tpu_tuner.tuning import TuneOptions
from tpu_tuner.tuning.options.tune_options import ObjectiveOptions, RunnerOptions
from tpu_tuner.tuning.run.clock import (
    Clock,
    FinishPlan,
    finish_seconds,
    plan_finish,
    process_seconds,
    reserved_finish_seconds,
    search_may_go_on,
)
from tpu_tuner.tuning.search import trial_attrs
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.search.tuning_trial import TuningTrial
from tpu_tuner.tuning.verify.verification import verify

SPACE = SearchSpace.load(Path(__file__).parent / "fixtures" / "tpu_eager_space.toml", "tpu")
DEFER_ENV = ["TORCH_TPU_DEFER_AND_FUSE=1"]
# The chip's trials (seconds): step, compile, worker start, overhead beyond compile and steps, env.
CHIP = [
    ("eager:strict", 0.2425, 2.74, 0.0, 62.9, []),  # the baseline: the first worker's first trial
    ("eager:defer_and_fuse", 0.1488, 7.85, 20.4, 78.4, DEFER_ENV),  # a worker started for its mode
]


def _study(rows=CHIP, envs: bool = True, reference_s: float = 0.0) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    for execution, step, compile_s, start_s, overhead_s, env in rows:
        study.enqueue_trial({"execution": execution, "matmul_precision": "medium"})
        trial = study.ask()
        params = SPACE.suggest(trial)
        m = steady_measurement(SPACE.to_candidate(params).to_dict(), step, compile_seconds=compile_s)
        TrialRecord.of(trial).update(
            {
                records.MEASURED: True,
                records.TRIAL_WALL_S: start_s + overhead_s + compile_s + 5 * step,
                records.WORKER_START_S: start_s,
                records.OVERHEAD_S: overhead_s,
                records.REFERENCE_S: reference_s if start_s else 0.0,
                **({records.START_ENV: env} if envs else {}),
            }
        )
        study.tell(trial, trial_attrs.record_measurement(trial, m, 5000, 0.01))
    return study


def test_a_process_costs_what_a_trial_in_a_worker_of_its_own_took_beyond_compile_and_steps() -> None:
    trials = TuningTrial.all(_study().get_trials())
    assert process_seconds(trials) == pytest.approx(20.4 + 78.4)
    # No trial started a worker of its own: the largest overhead (the first worker's first trial).
    assert process_seconds(TuningTrial.all(_study(CHIP[:1]).get_trials())) == pytest.approx(62.9)


def test_the_reference_outputs_a_trial_computed_are_not_a_process_start() -> None:
    study = _study(reference_s=50.0)
    assert process_seconds(TuningTrial.all(study.get_trials())) == pytest.approx(20.4 + 78.4 - 50.0)


def test_the_finish_of_settings_in_processes_of_their_own_is_costed_with_their_starts() -> None:
    plan = FinishPlan(0, 0, 12, False, 0.0)
    shared = finish_seconds(TuningTrial.all(_study(envs=False).get_trials()), plan)
    own = finish_seconds(TuningTrial.all(_study().get_trials()), plan)
    # One worker: two builds and 12 rounds of both steps, under 10 s.
    assert shared == pytest.approx(0.3 * (2.74 + 7.85) + 3 * (0.2425 + 0.1488) + 12 * (0.2425 + 0.1488))
    # Two blocks of 6 rounds: three process starts (A B, B A), each setting built in each block.
    starts, builds = 3 * (20.4 + 78.4), 2 * (0.3 * (2.74 + 7.85) + 3 * (0.2425 + 0.1488))
    assert own == pytest.approx(starts + builds + 12 * (0.2425 + 0.1488))
    assert own > 300


def test_the_search_keeps_room_for_the_process_starts_and_the_finish_fits_what_is_left() -> None:
    trials = TuningTrial.all(_study().get_trials())
    # A race and 6 rounds, each setting in a process of its own: five process starts of ~99 s.
    assert 500 < reserved_finish_seconds(trials) < 540  # the chip run kept about a minute
    now = [420.0]  # where the chip's search went on at 7 minutes of 8
    assert not search_may_go_on(trials, Clock(480.0, 0.0, lambda: now[0]))
    assert search_may_go_on(trials, Clock(1080.0, 0.0, lambda: now[0]))  # an 18-minute clock has room
    # With 5 minutes left the finish drops the knob-by-knob contributions and rounds to fit.
    plan = plan_finish(trials, 0, 12, 300.0)
    assert plan.seconds <= 300.0 and not plan.ablations and plan.verify_rounds < 12


class ClockedProcesses:
    """A chip whose processes take `start_s` to start on a fake clock (a job with another
    environment than the last starts one) and whose steps take their time."""

    keeps_warm_steps = True

    def __init__(self, start_s: float) -> None:
        self.start_s, self.now, self.env, self.starts = start_s, 0.0, None, 0

    def run(self, request: CompareRequest, env=None, timeout_s=None) -> JobResult:
        if (env or {}) != self.env:
            self.env, self.starts, self.now = env or {}, self.starts + 1, self.now + self.start_s
        steps = [0.1488 if c["execution"] == "eager:defer_and_fuse" else 0.2425 for c in request.candidates]
        samples = [[step] * request.rounds for step in steps]
        self.now += sum(sum(s) for s in samples)
        return JobResult(value=Comparison(samples=samples, compiles_while_comparing={}))


def test_a_verification_in_processes_of_their_own_ends_inside_the_clock() -> None:
    chip = ClockedProcesses(start_s=90.0)  # under the 98.8 s the search measured: the estimate errs long
    options = TuneOptions(
        objective=ObjectiveOptions(verify_rounds=12), runner=RunnerOptions(trial_settings=ProfilerSettings())
    )
    budget = 330.0
    v = verify(_study(), SPACE, chip, options, "tpu", clock=Clock(budget, 0.0, lambda: chip.now))
    assert chip.now <= budget and chip.starts == 3
    assert v.verdict.value == "verified" and v.speedup is not None
    assert v.speedup.speedup == pytest.approx(0.2425 / 0.1488, rel=1e-6)
    assert v.chosen.to_dict()["execution"] == "eager:defer_and_fuse"
