"""Issue 56, item 3: `tpu-tune buckets --device tpu` and a tuning run's bucketing context, end to
end in this process on a fake TorchTPU (a CPU backend named "tpu" whose ``tpu_compilations``
counts each graph as the chip counts each program it compiles, and whose cache counters move
with it), so every step from the worker's measurement to buckets.json and the CLI's lines runs."""

from __future__ import annotations

import json
import os
import types
from typing import Any

import numpy as np
import pytest
import torch
from conftest import FIXTURES

from tpu_tuner.bucketing import study
from tpu_tuner.bucketing.measured import measurement_lines
from tpu_tuner.bucketing.options import BucketChoice, BucketMeasurement, BucketOptions
from tpu_tuner.devices.cpu import CpuBackend
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.model.buckets.lengths import LengthHistogram
from tpu_tuner.runner import jobs, worker_state
from tpu_tuner.runner.trial_runner import JobResult
from tpu_tuner.tuning.options.tune_options import TuneOptions
from tpu_tuner.tuning.run.run_setup import bucketing_context

ENCODER = FIXTURES / "tiny_encoder.py"


@torch._dynamo.register_backend(name="fake_tpu")
def fake_tpu_compile(graph: torch.fx.GraphModule, example_inputs: Any) -> Any:
    """TorchTPU's "tpu" compile backend as far as shapes go: one program per static shape."""
    return graph.forward


class FakeTorchTpu(CpuBackend):
    """The chip's counters as devices/torchtpu.py reads them (`_get_cache_stats()`): a program per
    dynamo graph compiled, each a cache request that missed (hits: tests/test_tpu_buckets.py)."""

    kind = "tpu"
    label = "a fake TorchTPU"

    def device_name(self) -> str:
        return "TPU v5e (fake)"

    def default_compile_backend(self) -> str:
        return "fake_tpu"

    def compile_events(self) -> dict[str, int]:
        events = super().compile_events()
        compiled = events["torch_compile_graphs"]
        return {
            **events,
            "tpu_compilations": compiled,
            "tpu_cache_requests": compiled,
            "tpu_cache_hits": 0,
        }


class InProcessRunner:
    """TrialRunner's interface, each job run here (runner/jobs.py) on the fake chip."""

    def __init__(self, workload_path: str, device: str | None = None, *_: Any, **__: Any) -> None:
        self.state = jobs.WorkerState(workload_path, device)
        self.envs: list[dict[str, str]] = []
        self.timeout_s, self.device_kind = 60.0, None

    def run(self, request: Any, env: dict[str, str] | None = None, timeout_s: float | None = None) -> JobResult:
        self.envs.append(dict(env or {}))
        return JobResult(value=jobs.run_job(self.state, request))

    def __enter__(self) -> InProcessRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


@pytest.fixture
def fake_chip(monkeypatch):
    monkeypatch.setattr(worker_state, "get_backend", lambda name=None: FakeTorchTpu())
    monkeypatch.setattr(study, "get_backend", lambda name=None: FakeTorchTpu())
    monkeypatch.setattr(study, "TrialRunner", InProcessRunner)


def test_buckets_on_tpu_state_the_measured_compile_per_shape_hits_and_padding(fake_chip, tmp_path) -> None:
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(str(n) for n in (3, 5, 6, 9, 12, 14, 16, 16)))  # probed at 8 and 16: quick traces
    options = BucketOptions(
        choice=BucketChoice(lengths_file=lengths, planned_steps=1000, max_buckets=3),
        measure=BucketMeasurement(device="tpu"),
    )
    result = study.plan_buckets(ENCODER, options)
    assert (result.device, result.device_name, result.compile_backend) == ("tpu", "TPU v5e (fake)", "fake_tpu")
    shapes = result.cost_model.shapes
    assert [s.length for s in shapes] == [8, 16] and all(
        s.counter == "tpu_compilations" and s.compilations for s in shapes
    )
    assert all(s.compile_seconds == pytest.approx(max(0.0, s.first_seconds - s.warm_seconds)) for s in shapes)
    assert all(s.cache_hits == 0 and s.cache_requests for s in shapes)  # a new length: compiled, not hit
    assert [s.bound for s in result.chosen_shares] == list(result.chosen.strategy.bounds)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["device_name"] == "TPU v5e (fake)"
    assert {"compile_seconds", "compilations", "cache_hits", "first_seconds", "warm_seconds"} <= set(
        data["cost_model"]["shapes"][0]
    )
    assert data["chosen"]["padding_seconds"] >= 0 and data["chosen_shares"][0]["expected_steps"] > 0
    lines = "\n".join(measurement_lines(result))
    assert "measured on TPU v5e (fake) (tpu, torch.compile backend 'fake_tpu'" in lines
    assert "where tpu_compilations counted a compilation, 0 on a cache hit" in lines
    assert "us per padded token" in lines and "compile amortised over their expected steps" in lines


def test_every_measuring_worker_gets_an_empty_torchtpu_compile_cache(monkeypatch) -> None:
    monkeypatch.setenv("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", "/warm/cache/of/the/user")
    with study.cold_compile_env() as env:
        folder = env["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"]
        assert folder != "/warm/cache/of/the/user" and not any(os.scandir(folder))


def test_a_tuning_run_measures_its_length_curve_on_tpu_and_buckets_each_trial(fake_chip) -> None:
    """tuning/run/run_setup.py's bucketing context on the fake chip: the baseline (TorchTPU's defaults)
    stepped at the probed lengths in the worker, then a trial's best bucketing from it."""
    runner = InProcessRunner(str(ENCODER), "tpu")
    hist = LengthHistogram.from_sample(np.array([3, 5, 5, 8, 9, 12, 12, 12, 17, 20, 31, 40, 40, 64]))
    profile = types.SimpleNamespace(
        workload=types.SimpleNamespace(seq_len=16),
        device=types.SimpleNamespace(kind="tpu"),
        candidate=Candidate.baseline("tpu"),  # the profiled baseline (no memory fit needed)
    )
    said: list[str] = []
    context = bucketing_context(
        runner.state.workload, hist, TuneOptions(), runner, profile, lambda _, text: said.append(text)
    )
    assert "measuring step time at" in said[0] and len(context.shape_model.fit_points) >= 2
    # The compile cost per length as the chip measured it reaches the trials' bucketing (it was
    # fitted from no compile points, so every trial's bucketing charged none).
    model = context.shape_model
    assert len(model.compile_samples) == len(model.fit_points) and len(model.shapes) == len(model.fit_points)
    best = context.best(step_seconds=0.01, compile_seconds=20.0, planned_steps=2000)
    assert best.strategy.bounds[-1] >= 64 and best.total_seconds > 0


def test_the_dashboard_states_the_measured_compiles_hits_and_padding(tmp_path) -> None:
    from tpu_tuner.dashboard.collect import collect
    from tpu_tuner.dashboard.planner_sections import buckets_section

    shape = {"length": 128, "first_seconds": 21.0, "warm_seconds": 0.5, "compile_seconds": 20.5}
    shapes = [
        {**shape, "compilations": 3, "cache_hits": 0, "counter": "tpu_compilations"},
        {
            **shape,
            "length": 256,
            "compile_seconds": 0.0,
            "compilations": 0,
            "cache_hits": 2,
            "counter": "tpu_compilations",
        },
    ]
    chosen = {"padding_waste": 0.05, "padding_seconds": 120.0, "compile_seconds": 41.0}
    data = {
        "workload": "encoder",
        "device": "tpu",
        "device_name": "TPU v5e",
        "steps": 20000,
        "cost_model": {"shapes": shapes},
        "chosen": chosen,
        "histogram": {"lengths": [100, 200], "counts": [3, 1]},
        "chosen_buckets": [128, 256],
    }
    folder = tmp_path / "encoder-buckets-20261206-000000"
    folder.mkdir()
    (folder / "buckets.json").write_text(json.dumps(data))
    page = buckets_section(collect(tmp_path))
    assert (
        "measured on TPU v5e: 2 new shapes, 0.00-20.50 s compile each (1 compiled, 1 cache hits by "
        "tpu_compilations); over 20000 steps the chosen buckets pay 120.0 s of padding against 41.0 s" in page
    )
    del data["cost_model"]  # a result written before these figures: the section as it was
    (folder / "buckets.json").write_text(json.dumps(data))
    assert "measured on" not in buckets_section(collect(tmp_path))
