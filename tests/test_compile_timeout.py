"""Issue 58, item 5: a compile that hangs is bounded. The compile pool waited on its workers with
no timeout, so one hung compile held a plan forever; now a job past `--compile-timeout` has its
worker killed and fails with the reason, and a fresh worker takes the next job."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.model.meshes.layouts import Layout
from tpu_tuner.planner.compiler.compile_pool import CompilePool
from tpu_tuner.planner.compiler.compile_request import CompileJob, CompileModel, CompileTarget, StepSettings
from tpu_tuner.planner.plans.plan_options import PlanCompile
from tpu_tuner.planner.plans.plan_space import PlanPoint


def _job(model_file: Path) -> CompileJob:
    model = CompileModel(str(model_file), None, 256, 1)
    return CompileJob(model, CompileTarget("v5e:1x1"), StepSettings(8, 128), PlanPoint(Layout(1, 1, 1)), fast=True)


def test_a_hung_compile_is_killed_at_its_timeout_and_fails_with_the_reason(tmp_path: Path) -> None:
    hanging = tmp_path / "hanging.py"
    hanging.write_text("import time\ntime.sleep(600)\n")  # the job hangs while its model file loads
    started = time.monotonic()
    with CompilePool(1, log_path=tmp_path / "compile.log", timeout_s=1.0) as pool:
        results = pool.compile([_job(hanging)])
        assert not pool._idle  # the hung worker was killed, not kept for the next job
    assert time.monotonic() - started < 30
    hung = results[_job(hanging)]
    assert hung.error is not None and "still compiling after 1 s (--compile-timeout)" in hung.error


def test_the_timeout_is_a_positive_number_of_seconds() -> None:
    with pytest.raises(UserInputError, match="--compile-timeout"):
        PlanCompile(workers=1, compile_timeout_s=0.0)
