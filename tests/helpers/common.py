"""Helpers shared by several test modules: the builders, fakes and fixture data more than one test
file uses, each under the name it is imported by (docs/testing.md, "Shared helpers"). A test module
imports from here (or from conftest.py), never from another test module (tests/test_test_hygiene.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import optuna
import pytest
from conftest import FIXTURES, steady_measurement, wait_until

from tpu_tuner.core.definitions import load_definition
from tpu_tuner.devices import roofline
from tpu_tuner.execution.measurement import Measurement, TrialFailure
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.metrics.paired import paired_speedup
from tpu_tuner.model.workloads.profiled import ProfiledWorkload
from tpu_tuner.profiling.verdict import decide
from tpu_tuner.runner.requests import MeasureRequest
from tpu_tuner.runner.trial_runner import JobResult
from tpu_tuner.studies.liveness import Worker
from tpu_tuner.tuning import TuneOptions
from tpu_tuner.tuning.agents import PrecisionAgent
from tpu_tuner.tuning.options.tune_options import RunnerOptions, SearchOptions, default_trial_settings
from tpu_tuner.tuning.run.tuning_result import TuningResult
from tpu_tuner.tuning.search import trial_attrs
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.search.trials import run_search
from tpu_tuner.tuning.verify.verification import Verification
from tpu_tuner.tuning.verify.window_figures import WindowFigures

# --- a precision agent on an injected hardware probe (tests/test_agents_hardware.py, test_agent_levers.py) ---


def injected_probe(fp32: float, bf16: float, medium_error: float) -> roofline.RooflineProbe:
    """A hardware probe with these float32 and bfloat16 matmul rates and this error of "medium" numerics."""
    return roofline.RooflineProbe(
        float32_flops_per_s=fp32,
        bfloat16_flops_per_s=bf16,
        copy_bytes_per_s=2e10,
        matmul_size=2048,
        copy_bytes=1,
        repeats=3,
        measured_at="injected",
        dispatch_seconds_per_op=1e-6,
        medium_relative_error=medium_error,
        measured_at_epoch=time.time(),
    )


# A host with AMX (docs/mfu.md): bfloat16 matmuls four times float32's, "medium" numerics at bfloat16's error.
AMX = injected_probe(300e9, 1200e9, 2.5e-3)


def precision_agent(probe: roofline.RooflineProbe | None) -> PrecisionAgent:
    """The CPU precision agent, deciding from `probe` (None: no probe measured)."""
    return PrecisionAgent(load_definition("agents", "precision"), "cpu", probe)


def matmul_heavy_profile(training: bool = True) -> SimpleNamespace:
    """A profile whose step is 80% `aten::addmm`: compute-bound in float32."""
    verdict = decide(
        6e9,
        1e8,
        0.05,
        300e9,
        "float32",
        2e10,
        40,
        0.5,
        dispatch_seconds_per_op=1e-6,
        top_operators=[("aten::addmm", 0.8)],
    )
    return SimpleNamespace(
        verdict=verdict,
        peak_dtype="float32",
        operators=[SimpleNamespace(name="aten::addmm", share=0.8)],
        workload=SimpleNamespace(training=training),
    )


# --- the threads knob on a host of so many cores (tests/test_threads_knob.py, test_agent_levers.py) ---


def pin_cores(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """Make this process see `count` usable cores (`os.sched_getaffinity`)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(count)))


def threads_profile(dispatch_share: float | None, ops: int, step_s: float, cv: float | None) -> object:
    """A profile with the figures the threads agent reads: dispatch share, ops a step, step time, its spread."""
    verdict = SimpleNamespace(dispatch_share=dispatch_share, ops_per_step=ops, step_seconds=step_s, step_cv=cv)
    return SimpleNamespace(verdict=verdict, environment={"threads": "2"})


# --- a search's measurement (tests/test_failure_learning.py, test_crashing_value.py) ---------------


def step_measurement(candidate: dict, step: float, compile_s: float = 0.0) -> Measurement:
    """A measurement of `candidate` at `step` s a step (and `compile_s` of compile), exact accuracy,
    MFU from 1 MFLOP a step at 1 GFLOP/s."""
    return Measurement(
        candidate=candidate,
        step_median=step,
        step_p10=step,
        step_p90=step,
        samples=[step] * 10,
        first_call_seconds=step + compile_s,
        warmup_seconds=step,
        compile_seconds=compile_s,
        compiles={},
        model_flops_per_step=1e6,
        peak_flops_per_s=1e9,
        peak_dtype="float32",
        mfu=1e6 / step / 1e9,
        peak_memory_bytes=None,
        accuracy_errors={"output": 0.0},
    )


# --- a tuning study recorded the way the search writes it (tests/test_trial_record.py, test_old_studies.py) ---


RECORD_SPACE = SearchSpace.load("default", "cpu")
RECORD_BASE = RECORD_SPACE.baseline_params()


# Enqueued in this order: measured; repeated; rejected by the agent; infeasible (accuracy); failed.
RECORD_SETTINGS = [
    RECORD_BASE,
    RECORD_BASE,
    {**RECORD_BASE, "memory_format": "channels_last"},
    {**RECORD_BASE, "matmul_precision": "high"},
    {**RECORD_BASE, "autocast": "bfloat16"},
]
RECORD_BUDGET = 3  # the three measured settings: the repeat and the rejection cost none


class SequenceRunner:
    """Answers the study's measure jobs in order: a measurement, an inaccurate one, a failure."""

    workers_started = 0

    def __init__(self) -> None:
        self.jobs = 0

    def check_usable(self) -> None:
        pass  # the Runner protocol: every job can run here

    def run(self, request: MeasureRequest, env: Any = None, timeout_s: float | None = None) -> JobResult:
        self.jobs += 1
        if self.jobs == 3:
            return JobResult(failure=TrialFailure("error", "RuntimeError: boom"), seconds=0.5)
        m = Measurement(
            candidate=dict(request.candidate),
            step_median=0.2,
            step_p10=0.19,
            step_p90=0.21,
            samples=[0.2] * 20,
            first_call_seconds=1.5,
            warmup_seconds=0.5,
            compile_seconds=1.0,
            compiles={},
            model_flops_per_step=1e10,
            peak_flops_per_s=1e12,
            peak_dtype="float32",
            mfu=0.05,
            peak_memory_bytes=2**30,
            accuracy_errors={"loss": 1e-6 if self.jobs == 1 else 0.5},
            compute_dtype="float32",
        )
        return JobResult(value=m, seconds=0.25)


class RejectChannelsLast:
    """An agent that turns away the channels-last setting before it runs."""

    name = "layout"

    def validate(self, candidate: Any) -> str | None:
        return (
            "channels_last: not on this model" if candidate.to_dict().get("memory_format") == "channels_last" else None
        )

    def learn(self, *args: Any) -> list[dict[str, str]]:
        return []


def recorded_search(storage: optuna.storages.BaseStorage | None = None) -> optuna.Study:
    """RECORD_SETTINGS searched in order on SequenceRunner: a measurement, a repeat, a rejection, an
    inaccurate one, a failure."""
    study = optuna.create_study(storage=storage, direction="minimize", sampler=optuna.samplers.RandomSampler(seed=0))
    for setting in RECORD_SETTINGS:
        study.enqueue_trial(setting)
    options = TuneOptions(search=SearchOptions(trials=RECORD_BUDGET, agents=(), sampler="random", seed=0))
    run_search(
        study,
        RECORD_SPACE,
        [RejectChannelsLast()],
        SequenceRunner(),
        MeasureRequest(),
        options,  # type: ignore[list-item]
        lambda event: None,
        time.perf_counter(),
        worker=Worker("worker-1", "host-1"),
    )
    return study


# --- a finished search and the race (tests/test_race.py, test_verify_window.py) --------------------


def precision_space() -> SearchSpace:
    """The CPU precision space (matmul precision x autocast)."""
    return SearchSpace.load("precision", "cpu")


def searched_study(search_figures: dict[tuple[str, str], float], buckets: list[int] | None = None) -> optuna.Study:
    """A finished search: one measured trial per setting, valued at its (noisy) search figure."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = precision_space()
    study = optuna.create_study()
    for (autocast, precision), value in search_figures.items():
        study.enqueue_trial({"matmul_precision": precision, "autocast": autocast})
        trial = study.ask()
        params = space.suggest(trial)
        m = steady_measurement(space.to_candidate(params).to_dict(), value)
        if buckets:
            trial.set_user_attr("buckets", buckets)  # as a search with varying input lengths records
        study.tell(trial, trial_attrs.record_measurement(trial, m, 5000, 0.01))
    return study


# --- a run verified in an interleaved window (tests/test_window_figures.py, and the report and verification tests) ---


WINDOW_FLOPS = 1.8e12  # model FLOPs per step
WINDOW_PEAK = 100e12  # the run's peak, FLOP/s

WINDOW_ROUNDS = 12


def _window_measurement(candidate: Candidate, median: float, p10: float, p90: float) -> Measurement:
    return Measurement(
        candidate=candidate.to_dict(),
        step_median=median,
        step_p10=p10,
        step_p90=p90,
        samples=[median],
        first_call_seconds=2.0,
        warmup_seconds=0.1,
        compile_seconds=1.5,
        compiles={},
        model_flops_per_step=WINDOW_FLOPS,
        peak_flops_per_s=WINDOW_PEAK,
        peak_dtype="bfloat16",
        mfu=WINDOW_FLOPS / median / WINDOW_PEAK,
        peak_memory_bytes=1 << 30,
        accuracy_errors={"loss": 1e-4},
    )


def window_samples() -> dict[str, list[float]]:
    """Twelve rounds at ~45 ms against ~18.9 ms, each round drifting a little (a shared machine)."""
    rng = np.random.default_rng(3)
    drift = 1 + 0.05 * rng.standard_normal(WINDOW_ROUNDS)
    return {
        "baseline": list(0.045 * drift * (1 + 0.01 * rng.standard_normal(WINDOW_ROUNDS))),
        "best": list(0.0189 * drift * (1 + 0.01 * rng.standard_normal(WINDOW_ROUNDS))),
    }


def window_result(tmp_path, window: bool = True, significant: bool = True) -> TuningResult:
    """A run whose search measured a disturbed baseline (median 447 ms, p10 55.7 ms, p90 1.02 s)."""
    space = SearchSpace.load("precision", "cpu")
    tuned = Candidate(matmul_precision="medium")
    study = optuna.create_study()
    for m in (
        _window_measurement(Candidate(), 0.447, 0.0557, 1.02),
        _window_measurement(tuned, 0.0189, 0.0187, 0.0192),
    ):
        trial = study.ask()
        study.tell(trial, trial_attrs.record_measurement(trial, m, 5000, 0.01))
    samples = window_samples()
    speedup = paired_speedup(samples["baseline"], samples["best"])
    verification = Verification(
        baseline_trial=0,
        best_trial=1,
        chosen=tuned if significant else Candidate(),
        chosen_is_best=significant,
        speedup=speedup,
        samples=samples,
        message=f"verified: {speedup.describe()}",
        window=WindowFigures.of(samples) if window else None,
    )
    profile = SimpleNamespace(
        workload=ProfiledWorkload.from_dict(
            {
                "name": "resnet18",
                "source": "resnet18.py",
                "convention": "native",
                "step": "training step",
                "batch_size": 32,
                "seq_len": None,
            }
        ),
        device=SimpleNamespace(name="host cpu", kind="cpu", count=1),
        peak_flops_per_s=WINDOW_PEAK,
        peak_dtype="bfloat16",
        verdict=SimpleNamespace(summary="compute-bound"),
        flops=SimpleNamespace(model_formula="counted"),
        memory=SimpleNamespace(peak_bytes=3 << 29, method="VmHWM"),  # the profile's: 1.5 GiB
        fitted_to_memory={},  # the step fit the device as written
        warnings=[],
    )
    return TuningResult(
        run_dir=tmp_path,
        study=study,
        space=space,
        profile=profile,  # type: ignore[arg-type]
        findings={},
        verification=verification,
        options=TuneOptions(runner=RunnerOptions(trial_settings=default_trial_settings())),  # as a run resolves them
    )


# --- result folders for the dashboard --------------------------------------------------------------
# (tests/test_dashboard.py, test_dashboard_figures.py, test_dashboard_browser.py, test_library_logging.py)


TUNED_CONFIG = """\
format_version = 1
device_kind = "cpu"

[settings]
eager_mode = "strict"
compile_backend = "inductor"
matmul_precision = "highest"
autocast_dtype = "bfloat16"

[provenance]
created = "2026-11-29T09:24:33+00:00"
device = "AMD EPYC"
accuracy_error = 0.0029

[provenance.workload]
name = "gpt"

[provenance.baseline]
step_median_s = 0.76
mfu = 0.626

[provenance.tuned]
step_median_s = 0.445
mfu = 0.391
peak_dtype = "bfloat16"

[provenance.verification]
speedup = 1.548
ci_low = 1.49
ci_high = 1.60
significant = true

[provenance.study]
trials = 6
"""


# Trial 3 repeats trial 1 and trial 4 was rejected before running: neither counts as measured.
TRIALS_CSV = """\
number,state,execution,matmul_precision,autocast,amortised_step_s,step_median_s,compile_s,mfu,accuracy_error,feasible,peak_memory_bytes,failure_kind,failure_message,rejected_by,repeat_of,trial_wall_s,duration_s
0,COMPLETE,eager,highest,none,0.76,0.76,0.01,0.626,0.0,True,1e9,,,,,11,11
1,COMPLETE,inductor,highest,bfloat16,0.445,0.445,0.76,0.391,0.0029,True,1e9,,,,,13,13
2,COMPLETE,eager,medium,none,0.665,0.665,0.0,0.26,3e-7,True,1e9,,,,,9,9
3,COMPLETE,inductor,highest,bfloat16,0.445,0.445,0.76,0.391,0.0029,True,1e9,,,,1.0,13,13
4,PRUNED,aot_eager,high,none,,,,,,,,,,precision: same as highest,,0,0
5,FAIL,aot_eager,medium,bfloat16,,,,,,,,timeout,killed after 300 s,,,300,300
"""


def plan_dict(topology: str, chips: int, mfus: list[float | None], fits: list[bool]) -> dict:
    """plan.json as PlanResult.to_dict() writes it (planner/plans/plan.py)."""
    plans = []
    for index, (mfu, fit) in enumerate(zip(mfus, fits)):
        prediction = (
            None
            if mfu is None
            else {
                "compute_seconds": 0.8,
                "memory_seconds": 0.5,
                "comm_seconds": 0.4,
                "exposed_comm_seconds": 0.1,
                "step_seconds": 1.0 + 0.1 * index,
                "alignment": 1.0,
                "mfu": mfu,
                "tokens_per_second": 1e5,
            }
        )
        plans.append(
            {
                "layout": {"data": 1, "fsdp": chips // (index + 1), "tensor": index + 1},
                "compiled": {
                    "flops": 1e15,
                    "bytes_accessed": 1e12,
                    "argument_bytes": 1e9,
                    "output_bytes": 1e9,
                    "temp_bytes": 1e9,
                    "alias_bytes": 0.0,
                    "collectives": [],
                    "compile_seconds": 3.0,
                    "error": None if mfu is not None else "RESOURCE_EXHAUSTED",
                    "host_temp_bytes": 0.0,
                },
                "fits": fit,
                "margin_bytes": 1e9 if fit else -1e9,
                "why": "" if fit else "over HBM by 1 GiB",
                "prediction": prediction,
            }
        )
    best = max((p for p in plans if p["fits"] and p["prediction"]), key=lambda p: p["prediction"]["mfu"], default=None)
    return {
        "workload": "gpt",
        "preset": "70b",
        "topology": {"name": topology, "jax_name": "TPU v5p", "chips": chips, "devices": chips, "generation": "v5p"},
        "global_batch": 256,
        "seq_len": 4096,
        "remat": "full",
        "attention_convention": "full",
        "model_flops_per_step": 1e18,
        "matmul_parameters": 7e10,
        "plans": plans,
        "rejected": [],
        "placements": {},
        "method": "compiled",
        "seconds": 12.0,
        "best": None if best is None else "data {data} x fsdp {fsdp} x tensor {tensor}".format(**best["layout"]),
    }


def buckets_dict() -> dict:
    """buckets.json as BucketResult.to_dict() writes it (bucketing/study.py)."""
    evaluation = {
        "strategy": {"name": "optimal", "bounds": [64, 128, 256], "note": ""},
        "compiled_shapes": 3,
        "padding_waste": 0.12,
        "compile_seconds": 30.0,
        "step_seconds": 0.1,
        "total_seconds": 2030.0,
        "within_limits": True,
    }
    return {
        "workload": "tiny_encoder",
        "device": "cpu",
        "compile_backend": "inductor",
        "samples": 1000,
        "distinct_lengths": 4,
        "length_summary": {"p50": 100},
        "steps": 20000,
        "max_buckets": 8,
        "align": 8,
        "cost_model": {},
        "chosen": evaluation,
        "table": [evaluation],
        "oracle_seconds": 2000.0,
        "optimiser_seconds": 0.01,
        "histogram": {"lengths": [40, 100, 200, 250], "counts": [300, 400, 200, 100]},
        "replays": [],
        "replay_note": "",
        "seconds": 5.0,
        "chosen_buckets": [64, 128, 256],
    }


def write_json(root: Path, name: str, file: str, data: object) -> Path:
    """`data` as JSON in `root`/`name`/`file`; the folder."""
    folder = root / name
    folder.mkdir(parents=True)
    (folder / file).write_text(json.dumps(data))
    return folder


def write_ranking_folder(root: Path, topologies: list[str], name: str = "gpt_70b-plan-ranking-20261202-000000") -> Path:
    """A ranking folder as outputs/ranking_report.py writes it: ranking.json, ranking.md and one plan
    folder per slice (v5p-8 fits; v5p-16 does not; tpu7x-8 fits and has no price)."""
    from tpu_tuner.outputs.ranking_report import write_ranking
    from tpu_tuner.planner.plans.prices import price_table
    from tpu_tuner.planner.plans.ranking import Ranking, ranked, slice_of

    folder = root / name
    folder.mkdir(parents=True)
    prices = price_table()
    plans = {
        "v5p-8": plan_dict("v5p-8", 4, [0.41], [True]),
        "v5p-16": plan_dict("v5p-16", 8, [0.5], [False]),
        "tpu7x-8": plan_dict("tpu7x-8", 8, [0.3], [True]),
    }
    plans["tpu7x-8"]["topology"]["generation"] = "tpu7x"
    slices = []
    for topology in topologies:
        plan = plans[topology]
        for point in plan["plans"]:
            point["band"] = {"points": 4.0, "source": "test", "reasons": []}
        child = write_json(folder, f"gpt_70b-plan-{topology}-20261202-000000", "plan.json", plan)
        (child / "plan.md").write_text("# Plan\n")
        slices.append(slice_of(plan, prices.get(plan["topology"]["generation"]), child.name))
    ranking = Ranking(
        "examples/llama.py",
        "gpt",
        "70b",
        ranked(slices),
        {g: vars(p) for g, p in prices.items()},
        ["v5p-8", "v5p-16", "tpu7x-8"],
    )
    write_ranking(folder, ranking)
    return folder


# --- simulated hosts on loopback (tests/test_multi_host.py, test_frozen_host.py, test_partition.py) ---


REPO = Path(__file__).resolve().parents[2]  # tests/helpers/common.py
HOSTS_MARK = "TPU_TUNE_TEST_HOSTS_MARK"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def marked_processes(mark: str) -> list[str]:
    """This host's processes that carry `mark` in their environment (started by this test)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"{HOSTS_MARK}={mark}".encode() in environ.split(b"\0") and state != "Z":
            found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160])
    return found


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


class Hosts:
    """Simulated hosts: the same `tpu-tune` command in a folder of each host's own."""

    def __init__(self, root: Path, study: str, *flags: str, nnodes: int = 2, model: Path = FIXTURES / "tiny_llama.py"):
        self.root, self.mark, self.port = root, uuid.uuid4().hex, _free_port()
        self.command = [
            sys.executable,
            "-m",
            "tpu_tuner.cli",
            str(model),
            "--device",
            "cpu",
            "--nnodes",
            str(nnodes),
            "--nproc",
            "1",
            "--rdzv",
            f"127.0.0.1:{self.port}",
            "--study",
            study,
            "--storage",
            f"sqlite:///{root / 'study.db'}",
            "--out",
            "results",
            "--time-budget",
            "none",
            *flags,
        ]
        self.env = {
            **os.environ,
            HOSTS_MARK: self.mark,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        self.started: list[subprocess.Popen] = []

    def start(self, name: str, *extra: str) -> subprocess.Popen:
        """Host `name`'s command, in its own folder and session; its output in out<k>.txt there."""
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"out-{self.mark[:6]}-{len(self.started)}.txt"
        with open(path, "w") as out:
            process = subprocess.Popen(
                [*self.command, *extra],
                cwd=folder,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        process.out = path  # type: ignore[attr-defined]
        self.started.append(process)
        return process

    def start_pair(self, *extra: str) -> tuple[subprocess.Popen, subprocess.Popen]:
        """Host a (it serves the rendezvous, so it drives), then host b once a is listening."""
        a = self.start("a", *extra)
        deadline = time.monotonic() + 120
        while not listening(self.port):
            assert a.poll() is None and time.monotonic() < deadline, a.out.read_text()  # type: ignore[attr-defined]
            time.sleep(0.2)
        return a, self.start("b", *extra)

    def cleanup(self) -> None:
        for process in self.started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def ranks_up(hosts: Hosts) -> int:
    """How many rank processes the hosts' agents have running (both hosts' ranks, by their marker)."""
    return sum("rank_job" in command for command in marked_processes(hosts.mark))


def wait_for_nothing_left(hosts: Hosts) -> None:
    """Wait until no process the hosts started is left and their rendezvous port is closed."""
    wait_until(
        lambda: marked_processes(hosts.mark) == [] and not listening(hosts.port),
        60,
        lambda: f"left: {marked_processes(hosts.mark)}, port listening: {listening(hosts.port)}",
    )


def output_of(process: subprocess.Popen) -> str:
    """What a started host process has printed so far."""
    return process.out.read_text()  # type: ignore[attr-defined]


def study_trials(root: Path, study: str) -> list:
    """The trials of the hosts' shared study `study` in `root`/study.db."""
    import optuna

    return optuna.load_study(study_name=study, storage=f"sqlite:///{root / 'study.db'}").get_trials()


def ranks_of(pid: int) -> list[int]:
    """The rank processes whose parent is `pid` (a host agent's ranks)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent == pid and b"rank_job" in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


def json_lines(process: subprocess.Popen) -> list[dict]:
    """The JSON lines a started host process has printed."""
    return [json.loads(line) for line in output_of(process).splitlines() if line.startswith("{")]


def both_hosts_mid_job(hosts: Hosts, tmp_path: Path, name: str) -> tuple[subprocess.Popen, subprocess.Popen, float]:
    """Start the driver (tests/fixtures/host_driver.py, node 0, two measure jobs of tiny_llama on
    2 ranks a host) and the follower host "b", and return them once a job runs on both hosts'
    ranks, with the test's deadline."""
    folder = tmp_path / "a"
    folder.mkdir()
    with open(folder / "out.txt", "w") as out:
        driver = subprocess.Popen(
            [sys.executable, str(FIXTURES / "host_driver.py"), f"127.0.0.1:{hosts.port}", name]
            + [str(FIXTURES / "tiny_llama.py"), "2"],
            cwd=folder,
            env=hosts.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    driver.out = folder / "out.txt"  # type: ignore[attr-defined]
    hosts.started.append(driver)
    follower = hosts.start("b")
    deadline = time.monotonic() + 300
    while (
        sum(1 for line in json_lines(driver) if line.get("job") == "started") < 2
        or not ranks_of(follower.pid)
        or ranks_up(hosts) < 2
    ):
        assert driver.poll() is None and time.monotonic() < deadline, output_of(driver) + output_of(follower)
        time.sleep(0.1)
    return driver, follower, deadline


class ScriptedPool:
    """Stands in for the planner's compiler processes (`CompilePool`): answers each job from
    `answer` (a job -> `CompiledStep`), records the jobs in order, calls `done` as the pool does."""

    def __init__(self, answer: Any, workers: int = 1) -> None:
        self.answer, self.workers, self.jobs = answer, workers, []

    def compile(self, jobs: Any, done: Any = None) -> dict[Any, Any]:
        results = {}
        for job in jobs:
            self.jobs.append(job)
            results[job] = self.answer(job)
            if done:
                done(job, results[job])
        return results


def calibration_row(
    n: int,
    generation: str,
    efficiency: float,
    source: str,
    family: str = "",
    chips: int = 64,
    jitter: float = 0.002,
    layout: str = "fsdp",
) -> Any:
    """A synthetic planner calibration row, compute-bound: its published MFU is its generation's
    `efficiency` x 0.5 (compute twice the model FLOPs' time), off by `jitter` by row so that
    leave-one-out errors are not 0; `family` defaults to one of two by row number."""
    from tpu_tuner.planner.calibration.rows import CalibrationRow

    return CalibrationRow(
        number=n,
        generation=generation,
        fits=True,
        peak_bytes=1.0,
        hbm_bytes=2.0,
        compute_at_full_efficiency=1.0,
        memory_seconds=0.0,
        comm_seconds=0.0,
        model_seconds_at_peak=0.5,
        published_mfu=0.5 * efficiency + jitter * (n % 3 - 1),
        id=f"{generation}-{n}",
        remat_family="full",
        seq=4096,
        per_device_batch=4.0,
        source=source,
        family=family or f"f{n % 2}",
        chips=chips,
        layout=layout,
    )


def benchmark_script(path: Path, name: str | None = None) -> Any:
    """A script of benchmarks/ imported as a module (registered under `name`, default its stem),
    for tests of its functions: the scripts are run as files, not imported as a package."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def allocation_peak(step_of: object) -> int:
    """The peak of the c10 CPU allocator's live bytes over building the step and two steps, read
    from the profiler's allocation events: an instrument independent of the estimate's."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step = step_of()  # type: ignore[operator]
        step.run_eager()
        step.run_eager()
    sizes, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation:
            sizes.append((event.start_time_ns, event.extra_fields.alloc_size))
    live = peak = 0
    for _, size in sorted(sizes):
        live += size
        peak = max(peak, live)
    return peak
