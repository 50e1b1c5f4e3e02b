"""Issue 56, item 1: trials that keep the chip. On a TPU v5e chip each trial paid ~15 s of worker
start and a compile from nothing. Here, with a stand-in worker (tests/test_keep_the_chip_child.py)
and TorchTPU's environment values, no chip: the worker says READY so its start is measured apart
from its job; TorchTPU's compilation cache goes to every worker of a run without deciding a
restart; the seeds are queued so that settings sharing a start-up environment run back to back;
and a trial's wall time is split into start, compile, steps and the rest."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import pytest

from tpu_tuner.devices.torchtpu import COMPILATION_CACHE_FOLDER, COMPILATION_CACHE_VARIABLE, TorchTpuBackend
from tpu_tuner.execution.measurement import EarlyStop, Measurement
from tpu_tuner.outputs.trial_costs import cost_line, trial_costs
from tpu_tuner.runner import trial_runner
from tpu_tuner.runner.trial_runner import JobResult, TrialRunner
from tpu_tuner.runner.worker_process import Replied, WorkerProcess
from tpu_tuner.studies.records import BUILD_S, ESTIMATE_S, JUDGE_S
from tpu_tuner.studies.trial_costs import OVERHEAD_S, REFERENCE_S, STEPS_S, WORKER_START_S, cost_keys
from tpu_tuner.tuning.search import seeding
from tpu_tuner.tuning.search.search_space import SearchSpace

TESTS = Path(__file__).parent
CHILD = "test_keep_the_chip_child"
CHILD_ENV = {"PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
SPACE = SearchSpace.load(TESTS / "fixtures" / "tpu_eager_space.toml", "tpu")
DEFER = {"TORCH_TPU_DEFER_AND_FUSE": "1"}


def run_folder(results: Path) -> Path:
    """A run's folder in the results folder `results`, as `core.run_folder.new_run_dir` makes it."""
    folder = results / "gpt-tune-1"
    folder.mkdir()
    return folder


@pytest.fixture
def child_runner(monkeypatch, tmp_path) -> TrialRunner:
    """A TrialRunner whose workers are the stand-in (a start of 0.1 s), its log in `tmp_path`."""
    monkeypatch.setattr(trial_runner, "WORKER_MODULE", CHILD)
    monkeypatch.setenv("PYTHONPATH", CHILD_ENV["PYTHONPATH"])
    monkeypatch.setenv("CHILD_START_S", "0.1")
    monkeypatch.delenv(COMPILATION_CACHE_VARIABLE, raising=False)
    runner = TrialRunner("unused.py", "cpu", timeout_s=30)
    yield runner
    runner.close()


def test_the_parent_measures_a_workers_start_until_it_says_ready() -> None:
    worker = WorkerProcess(CHILD, env={**CHILD_ENV, "CHILD_START_S": "0.3"})
    try:
        outcome = worker.request("job", timeout_s=30)
        assert isinstance(outcome, Replied) and outcome.value["job"] == "job"  # READY is no reply
        assert worker.ready_s is not None and 0.3 <= worker.ready_s < 5
    finally:
        worker.close()


def test_a_job_says_what_its_workers_start_cost_and_nothing_on_a_warm_worker(child_runner) -> None:
    first = child_runner.run("a")
    second = child_runner.run("b")
    assert first.ok and first.start_s is not None and 0.1 <= first.start_s <= first.seconds
    assert second.ok and second.start_s == 0.0 and second.value["pid"] == first.value["pid"]


def test_a_tpu_runs_workers_keep_its_compilations_in_the_results_folder_without_a_restart(
    child_runner, tmp_path
) -> None:
    cache = str(tmp_path / COMPILATION_CACHE_FOLDER)
    child_runner.run("load")  # the load job: no run folder and no device kind yet
    child_runner.device_kind = "tpu"
    child_runner.log.move_into(run_folder(tmp_path))  # the run folder, in the results folder
    warm = child_runner.run("profile")
    assert warm.start_s == 0.0 and child_runner.workers_started == 1  # the same for every job: no restart
    defer = child_runner.run("trial", env=DEFER)  # another start-up environment: a new worker
    assert child_runner.workers_started == 2
    assert defer.value["env"] == {COMPILATION_CACHE_VARIABLE: cache, **DEFER}
    strict = child_runner.run("trial")
    assert child_runner.workers_started == 3 and strict.value["env"][COMPILATION_CACHE_VARIABLE] == cache
    assert Path(cache).is_dir()


def test_the_first_worker_is_inside_the_cache_where_the_device_and_results_folder_are_known(
    child_runner, tmp_path
) -> None:
    """Issue 68, item 5: the first worker loads the model before the run folder is named; given
    the results folder and a TPU up front (`tune_run`), it starts inside the cache and stays."""
    cache = str(tmp_path / COMPILATION_CACHE_FOLDER)
    child_runner.cache_home, child_runner.device_kind = tmp_path, "tpu"
    load = child_runner.run("load")
    assert load.value["env"][COMPILATION_CACHE_VARIABLE] == cache
    child_runner.log.move_into(run_folder(tmp_path))
    trial = child_runner.run("trial")
    assert trial.start_s == 0.0 and child_runner.workers_started == 1  # the same worker, no restart
    assert trial.value["env"][COMPILATION_CACHE_VARIABLE] == cache


def test_the_device_is_known_before_loading_where_asked_for_or_where_the_pci_bus_shows_tpus(monkeypatch) -> None:
    from tpu_tuner.core import tpu_host
    from tpu_tuner.tuning.run.tune_run import expected_device_kind

    monkeypatch.setattr(tpu_host, "tpu_chips_on_host", lambda: {})
    assert [expected_device_kind(d) for d in ("tpu", "cpu", "auto", None)] == ["tpu", "cpu", None, None]
    monkeypatch.setattr(tpu_host, "tpu_chips_on_host", lambda: {"TPU v5e": 1})
    assert [expected_device_kind(d) for d in ("cpu", "auto", None)] == ["cpu", "tpu", "tpu"]


def test_no_cache_on_cpu_and_the_users_own_value_wins(child_runner, tmp_path, monkeypatch) -> None:
    child_runner.log.move_into(run_folder(tmp_path))
    child_runner.device_kind = "cpu"
    assert child_runner.run("job", env=DEFER).value["env"][COMPILATION_CACHE_VARIABLE] is None
    monkeypatch.setenv(COMPILATION_CACHE_VARIABLE, "/mine")
    child_runner.device_kind = "tpu"
    assert TorchTpuBackend.worker_environment(tmp_path) == {}
    assert child_runner.run("job").value["env"][COMPILATION_CACHE_VARIABLE] == "/mine"


def test_ranks_of_a_sharded_trial_get_the_runs_variables(monkeypatch, tmp_path) -> None:
    from tpu_tuner.runner import launch
    from tpu_tuner.runner.ranked_runner import RankedTrialRunner
    from tpu_tuner.runner.requests import MeasureRequest

    monkeypatch.delenv(COMPILATION_CACHE_VARIABLE, raising=False)
    seen: dict[str, Any] = {}

    def fake_run_ranks(nproc, module, args, timeout_s, **kwargs) -> launch.RanksResult:
        seen.update(kwargs["env"])
        return launch.RanksResult(failure="stopped here", kind="error", ranks=0)

    monkeypatch.setattr(launch, "run_ranks", fake_run_ranks)
    with RankedTrialRunner("unused.py", "tpu", 2) as runner:
        runner.log.move_into(run_folder(tmp_path))
        runner.device_kind = "tpu"
        runner.launch_environment = {"TORCH_TPU_TOPOLOGY": "1x2"}
        runner.run(MeasureRequest(), env=DEFER)
    assert seen == {
        "TORCH_TPU_TOPOLOGY": "1x2",
        COMPILATION_CACHE_VARIABLE: str(tmp_path / COMPILATION_CACHE_FOLDER),
        **DEFER,
    }


class _Seeder:
    """An agent with one seed."""

    def __init__(self, name: str, seed: dict[str, str]) -> None:
        self.name, self.seed = name, seed

    def seeds(self, profile: object, space: SearchSpace) -> list[dict[str, str]]:
        return [self.seed]


def _worker_starts_of_the_queue() -> tuple[int, list[dict[str, Any]]]:
    """The seeds `enqueue_seeds` queues (strict, DeferAndFuse, strict, DeferAndFuse as the agents
    give them), asked in order, and the workers a runner starts for them: one per change of
    start-up environment, as TrialRunner starts them."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    agents = [
        _Seeder("compile", {"execution": "eager:defer_and_fuse"}),
        _Seeder("precision", {"matmul_precision": "high"}),
    ]
    seeding.enqueue_seeds(study, SPACE, agents, None)  # type: ignore[arg-type]  # fakes with the one method used
    asked, starts, env = [], 0, None
    backend = TorchTpuBackend
    for _ in range(4):
        trial = study.ask()
        params = SPACE.suggest(trial)
        study.tell(trial, 1.0)
        needed = SPACE.to_candidate(params).environment(backend)
        starts += needed != env
        env = needed
        asked.append(params)
    return starts, asked


def test_seeds_sharing_a_start_up_environment_run_back_to_back(monkeypatch) -> None:
    starts, asked = _worker_starts_of_the_queue()
    assert asked[0] == SPACE.baseline_params()  # the baseline first
    assert [p["execution"] for p in asked] == ["eager:strict"] * 2 + ["eager:defer_and_fuse"] * 2
    assert starts == 2
    # Queued as the agents give them, the same four settings start a worker each.
    monkeypatch.setattr(seeding, "by_start_environment", lambda settings, space, params_of: list(settings))
    assert _worker_starts_of_the_queue()[0] == 4


def test_grouping_keeps_the_order_within_each_environment_and_changes_nothing_on_cpu() -> None:
    strict, defer = {"execution": "eager:strict"}, {"execution": "eager:defer_and_fuse"}
    settings = [
        {**strict, "matmul_precision": "medium"},
        {**defer, "matmul_precision": "high"},
        {**strict, "matmul_precision": "high"},
        {**defer, "matmul_precision": "medium"},
    ]
    grouped = seeding.by_start_environment(settings, SPACE, lambda s: s)
    assert grouped == [settings[0], settings[2], settings[1], settings[3]]
    cpu = SearchSpace.load("default", "cpu")
    queue = [cpu.baseline_params(), {**cpu.baseline_params(), "matmul_precision": "high"}]
    assert seeding.by_start_environment(queue, cpu, lambda s: s) == queue


def _measurement(**fields: Any) -> Measurement:
    figures: dict[str, Any] = {
        "candidate": {},
        "step_median": 0.1,
        "step_p10": 0.1,
        "step_p90": 0.1,
        "samples": [0.1] * 20,  # 2 s of timed steps
        "first_call_seconds": 2.5,
        "warmup_seconds": 0.5,
        "compile_seconds": 2.0,  # so 1 s of the first call and warm-up ran at the steady speed
        "compiles": {},
        "model_flops_per_step": 1.0,
        "peak_flops_per_s": 1.0,
        "peak_dtype": "float32",
        "mfu": 0.1,
        "peak_memory_bytes": None,
        "accuracy_errors": {},
    }
    return Measurement(**{**figures, **fields})


def test_a_trials_wall_time_splits_into_start_compile_steps_and_the_rest() -> None:
    assert cost_keys(_measurement(), wall_s=10.0, start_s=3.0) == pytest.approx(
        {
            WORKER_START_S: 3.0,
            STEPS_S: 3.0,
            OVERHEAD_S: 2.0,
            REFERENCE_S: 0.0,
            ESTIMATE_S: 0.0,
            BUILD_S: 0.0,
            JUDGE_S: 0.0,
        }
    )
    # The reference's and the baseline's outputs this job computed: a part of the overhead.
    first = cost_keys(replace(_measurement(), reference_seconds=1.5), wall_s=10.0, start_s=3.0)
    assert first[REFERENCE_S] == 1.5 and first[OVERHEAD_S] == pytest.approx(2.0)
    warm = cost_keys(_measurement(), wall_s=6.0, start_s=0.0)
    assert warm[WORKER_START_S] == 0.0 and warm[OVERHEAD_S] == pytest.approx(1.0)
    stop = EarlyStop({}, "steps", "hopeless", [0.5, 0.5], 1.5, 1.0, 0.4)
    assert cost_keys(stop, wall_s=4.0, start_s=None) == pytest.approx(
        {WORKER_START_S: None, STEPS_S: 1.5, OVERHEAD_S: 1.5}  # a start not told apart is in the rest
    )
    assert cost_keys(None, wall_s=4.0, start_s=1.0) == {}  # a failure: no split
    assert JobResult().start_s is None
    # Issue 68: a sample is a block of steps, seconds per step: the block's steps all ran.
    blocks = replace(_measurement(), steps_per_sample=3)  # 20 samples of 3 steps at 0.1 s: 6 s
    assert cost_keys(blocks, wall_s=20.0, start_s=0.0)[STEPS_S] == pytest.approx(1.0 + 6.0)


def test_the_reports_line_counts_measured_settings_per_minute_and_the_median_beyond() -> None:
    frame = pd.DataFrame(
        {
            "trial_wall_s": [20.0, 10.0, 30.0, None],  # the third failed: its time counts, no setting
            "compile_s": [2.0, 1.0, None, None],
            WORKER_START_S: [15.0, 0.0, None, None],
            STEPS_S: [2.0, 8.0, None, None],
            OVERHEAD_S: [1.0, 1.0, None, None],
            REFERENCE_S: [0.5, 0.0, None, None],
        }
    )
    costs = trial_costs(frame)
    assert (costs.measured, costs.trial_minutes, costs.beyond_median_s) == (2, 1.0, 8.5)
    assert costs.reference_s == 0.5
    assert cost_line(frame, 3) == (
        "- Settings measured per minute: 2.0 (2 in 1.0 min of trials); per-trial cost beyond compile "
        "and timed steps: median 8.5 s, 0.5 s of it in all computing the fp32 reference's and the baseline's "
        "outputs (worker starts: 3)."
    )
    assert "n/a" in cost_line(pd.DataFrame({"trial_wall_s": [1.0]}), 1)  # an older run's table
    # Issue 68: the overhead's parts a worker told apart, as medians over the trials that have them.
    phased = frame.assign(
        **{ESTIMATE_S: [4.0, 2.0, None, None], BUILD_S: [3.0, 5.0, None, None], JUDGE_S: [0.1, 0.3, None, None]}
    )
    assert trial_costs(phased).phase_medians_s == pytest.approx({ESTIMATE_S: 3.0, BUILD_S: 4.0, JUDGE_S: 0.2})
    assert cost_line(phased, 3).endswith(
        "outputs; of it, medians: memory estimate 3.0 s, build 4.0 s, accuracy check 0.2 s (worker starts: 3)."
    )


def test_a_relative_results_folder_gives_the_workers_an_absolute_cache(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(COMPILATION_CACHE_VARIABLE, raising=False)
    monkeypatch.chdir(tmp_path)
    env = TorchTpuBackend.worker_environment(Path("results"))
    assert env == {COMPILATION_CACHE_VARIABLE: str(tmp_path / "results" / COMPILATION_CACHE_FOLDER)}
