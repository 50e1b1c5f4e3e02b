"""A compile job is one request from the plan to the compiler process: compile_step takes it whole
(beside the model's factory and the devices), and the worker hands it over as it came."""

from __future__ import annotations

import inspect
import pickle
from typing import Any

import pytest

from tpu_tuner.model.meshes.layouts import Layout
from tpu_tuner.planner.compiler import compile_pool
from tpu_tuner.planner.compiler.compile_request import CompileJob, CompileModel, CompileTarget, StepSettings
from tpu_tuner.planner.compiler.program import compile_step
from tpu_tuner.planner.plans.plan_space import PlanPoint

JOB = CompileJob(
    CompileModel("decoder:vocab=256,d_model=128,layers=2,heads=4,mlp=256", None, 128, 2, scan=True),
    CompileTarget("v5e:2x2", slices=2),
    StepSettings(8, 256, quantization="int8", xla_flags=(("xla_x", 1),)),
    PlanPoint(Layout(2, 4, 1, dcn_data=2), "minimal", 2),
    fast=True,
)


def test_compile_step_takes_the_job_whole_beside_the_models_factory_and_the_devices() -> None:
    assert list(inspect.signature(compile_step).parameters) == ["job", "build_meta_model", "devices"]


def test_a_worker_compiles_the_job_it_was_sent_on_its_targets_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    sent = pickle.loads(pickle.dumps(JOB))  # what a worker reads from its pipe
    assert sent == JOB and hash(sent) == hash(JOB)  # the pool keys its results by the job
    seen: dict[str, Any] = {}

    def compiled(job: CompileJob, build: Any, devices: Any) -> str:
        seen.update(job=job, devices=devices)
        return "compiled"

    monkeypatch.setattr(compile_pool, "compile_step", compiled)
    monkeypatch.setattr(compile_pool, "planned_source", lambda source: None)
    monkeypatch.setattr(CompileTarget, "devices", lambda target: ("devices of", target.topology, target.slices))
    assert compile_pool.run_job(sent) == "compiled"
    assert seen == {"job": JOB, "devices": ("devices of", "v5e:2x2", 2)}
