"""Issue 54, item 5: the verification measures what the search measured. TorchTPU reads its eager
mode once, at process start; switched inside one process on a v5e chip, a DeferAndFuse step
measured 0.15 / 0.23 s alternating where a DeferAndFuse process ran 0.25 s. A fake chip
reproduces that: one process holds it at a time, each started with an environment, and a setting
whose eager mode differs from its process's runs the in-process switch's bimodal steps. The window
runs each setting in a process of its own, alternating blocks of rounds."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
from conftest import steady_measurement

from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.profiling.settings import ProfilerSettings
from tpu_tuner.runner.requests import CompareRequest, Comparison
from tpu_tuner.runner.trial_runner import JobResult
from tpu_tuner.tuning import TuneOptions
from tpu_tuner.tuning.options.tune_options import ObjectiveOptions, RunnerOptions
from tpu_tuner.tuning.run.clock import MIN_BLOCK_ROUNDS, block_rounds
from tpu_tuner.tuning.search import trial_attrs
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.verify.interleaved import InterleavedWindow, start_environments
from tpu_tuner.tuning.verify.verification import verify

SPACE = SearchSpace.load(Path(__file__).parent / "fixtures" / "tpu_eager_space.toml", "tpu")
DEFER = {"TORCH_TPU_DEFER_AND_FUSE": "1"}
# A process's steps by its start-up eager mode (the chip's Llama-class figures, seconds).
PROCESS_STEP = {"strict": 0.246, "defer_and_fuse": 0.150}
SWITCHED = (0.232, 0.152)  # a DeferAndFuse step switched to inside a Strict process, alternating


def _mode(candidate: dict) -> str:
    return "defer_and_fuse" if candidate["execution"] == "eager:defer_and_fuse" else "strict"


class FakeChip:
    """One process on the chip at a time: a job with another environment starts a new one."""

    keeps_warm_steps = True

    def __init__(self) -> None:
        self.env: dict[str, str] | None = None
        self.starts = 0
        self.jobs: list[tuple[dict[str, str], list[str]]] = []  # (process env, modes it ran)
        self.switched = 0

    def run(self, request: CompareRequest, env=None, timeout_s=None) -> JobResult:
        env = env or {}
        if env != self.env:
            self.env, self.starts = env, self.starts + 1
        process_mode = "defer_and_fuse" if env == DEFER else "strict"
        self.jobs.append((env, [_mode(c) for c in request.candidates]))
        samples: list[list[float]] = [[] for _ in request.candidates]
        for _ in range(request.rounds):
            for kept, candidate in zip(samples, request.candidates):
                mode = _mode(candidate)
                if mode == process_mode:
                    kept.append(PROCESS_STEP[mode])
                else:  # the in-process switch: not what a process of that mode runs
                    kept.append(SWITCHED[self.switched % 2])
                    self.switched += 1
        return JobResult(value=Comparison(samples=samples, compiles_while_comparing={}))


def _candidates() -> list[dict]:
    return [Candidate().to_dict(), Candidate(execution="eager:defer_and_fuse").to_dict()]


def _options() -> RunnerOptions:
    return TuneOptions(runner=RunnerOptions(trial_settings=ProfilerSettings())).runner


def test_settings_fixed_per_process_run_in_processes_of_their_own_alternating() -> None:
    chip, candidates = FakeChip(), _candidates()
    environments = start_environments(candidates, "tpu")
    assert environments == [{}, DEFER]
    window = InterleavedWindow(chip, candidates, _options(), environments=environments)
    assert window.per_process and window.per_job == MIN_BLOCK_ROUNDS
    assert window.run(12) is None and window.rounds == 12
    assert chip.switched == 0  # every setting ran in a process started with its own mode
    assert all(modes == [("defer_and_fuse" if env == DEFER else "strict")] for env, modes in chip.jobs)
    # Three blocks, each setting's process in turn, the order rotating (A B, B A, A B).
    assert [env == DEFER for env, _ in chip.jobs] == [False, True, True, False, False, True]
    assert window.samples == [[0.246] * 12, [0.150] * 12]
    assert window.running_ratio() == pytest.approx(0.246 / 0.150)
    window.close()
    assert len(chip.jobs) == 6  # nothing kept to release


def test_the_fake_reproduces_the_in_process_switch_that_measured_another_step() -> None:
    """What the window did before: both settings in the first process, the mode switched inside it."""
    chip, candidates = FakeChip(), _candidates()
    window = InterleavedWindow(chip, candidates, _options())
    assert not window.per_process
    assert window.run(12) is None
    assert chip.starts == 1 and chip.switched == 12
    assert sorted(set(window.samples[1])) == sorted(SWITCHED)  # bimodal, not the process's 0.150
    assert not math.isclose(window.running_ratio(), 0.246 / 0.150, rel_tol=0.05)


def test_settings_sharing_an_environment_share_one_warm_worker() -> None:
    chip = FakeChip()
    candidates = [Candidate().to_dict(), Candidate(matmul_precision="high").to_dict()]
    window = InterleavedWindow(chip, candidates, _options(), environments=start_environments(candidates, "tpu"))
    assert not window.per_process and window.per_job == 1
    assert window.run(4) is None and chip.starts == 1


def _study() -> optuna.Study:
    """A search that measured DeferAndFuse at 0.150 s against the baseline's 0.246 s."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    for execution, value in (("eager:strict", 0.246), ("eager:defer_and_fuse", 0.150)):
        study.enqueue_trial({"execution": execution, "matmul_precision": "medium"})
        trial = study.ask()
        params = SPACE.suggest(trial)
        m = steady_measurement(SPACE.to_candidate(params).to_dict(), value, peak_dtype="bfloat16")
        study.tell(trial, trial_attrs.record_measurement(trial, m, 5000, 0.01))
    return study


def test_the_verification_of_an_eager_mode_matches_the_search_and_says_how_it_compared() -> None:
    chip = FakeChip()
    options = TuneOptions(
        objective=ObjectiveOptions(verify_rounds=12), runner=RunnerOptions(trial_settings=ProfilerSettings())
    )
    v = verify(_study(), SPACE, chip, options, "tpu")
    # 12 rounds in two blocks of 6 (block_rounds): each setting's process twice, the order reversed.
    assert chip.switched == 0 and [env == DEFER for env, _ in chip.jobs] == [False, True, True, False]
    assert chip.starts == 3  # A B, B A: the second block's first process is the first's last
    assert v.chosen_is_best and v.speedup.speedup == pytest.approx(0.246 / 0.150, rel=1e-6)
    assert "compared in 2 processes of their own (their start-up environments differ), alternating every 6 rounds" in (
        v.message
    )


def test_a_window_of_processes_runs_its_planned_rounds_in_two_blocks() -> None:
    """Each block starts every process afresh (on a v5e chip a Llama-class trial in a fresh worker
    cost 98.8 s beyond compile and steps): two blocks, one order then the other, cancel a linear
    drift at the fewest starts."""
    assert [block_rounds(r) for r in (4, 6, 8, 12, 13, 40)] == [4, 4, 4, 6, 7, 20]
    chip, candidates = FakeChip(), _candidates()
    window = InterleavedWindow(
        chip, candidates, _options(), environments=start_environments(candidates, "tpu"), block=block_rounds(12)
    )
    assert window.run(12) is None and window.rounds == 12
    assert [env == DEFER for env, _ in chip.jobs] == [False, True, True, False] and chip.starts == 3


class ClockedChip(FakeChip):
    """A fake chip whose steps take time on a clock, a DeferAndFuse step at a ratio that wanders
    round to round (so the window cannot decide from one block)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def run(self, request: CompareRequest, env=None, timeout_s=None) -> JobResult:
        samples: list[list[float]] = [[] for _ in request.candidates]
        for r in range(request.first_round, request.first_round + request.rounds):
            for kept, candidate in zip(samples, request.candidates):
                step = 1.0 if _mode(candidate) == "strict" else (0.5 if r % 2 else 1.0)
                kept.append(step)
                self.now += step
        self.jobs.append((env or {}, [_mode(c) for c in request.candidates]))
        return JobResult(value=Comparison(samples=samples, compiles_while_comparing={}))


def test_a_block_is_started_only_when_the_clock_holds_all_of_it() -> None:
    from tpu_tuner.tuning.verify.verify_window import measure_until_decided

    chip, candidates = ClockedChip(), _candidates()
    window = InterleavedWindow(
        chip, candidates, _options(), lambda: chip.now, environments=start_environments(candidates, "tpu")
    )
    budget = 10.0  # the first block takes 6 s: 1.5 s a round, so a second block needs 6 s more
    decided = measure_until_decided(window, 4, 40, lambda: budget - chip.now)
    assert not isinstance(decided, str) and decided.stopped_by == "clock"
    assert window.rounds == 4 and chip.now <= budget
