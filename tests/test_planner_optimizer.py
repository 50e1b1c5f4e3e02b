"""The planner's optimizer (--optimizer adamw|sgd; tpu_tuner/planner/compiler/optimizer.py): its state in
the memory bound and in the compiled step, and the one-line refusals."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from helpers.tiny_planner import TINY, TINY_MATRIX_PARAMETERS, needs_planner, planner_env

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.model.meshes.layouts import Layout, ModelShape
from tpu_tuner.planner.compiler.optimizer import check_optimizer, state_bytes_per_parameter
from tpu_tuner.planner.plans.plan_space import PlanPoint, memory_lower_bound


def _last_json(code: str) -> object:
    """Planner code in a fresh interpreter (torchax stays out of pytest's process, as in
    test_planner_compile.py); its last line of output is JSON."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=900, env=planner_env()
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_sgd_keeps_no_state_and_adamw_two_moments() -> None:
    assert state_bytes_per_parameter("adamw") == 8  # fp32 first and second moment
    assert state_bytes_per_parameter("adamw", first_moment_bytes=2, weight_bytes=2) == 4
    assert state_bytes_per_parameter("sgd", first_moment_bytes=2, weight_bytes=2) == 0
    with pytest.raises(UserInputError, match="--optimizer takes adamw or sgd, not 'lion'"):
        check_optimizer("lion")


def test_the_memory_lower_bound_follows_the_optimizer() -> None:
    point = PlanPoint(Layout(1, 4, 1), "full")
    shape = ModelShape(128, 4, 4, 256, 256, 2)
    adamw = memory_lower_bound(point, 1_000_000, shape, 8, 256, first_moment_bytes=2, weight_bytes=2)
    sgd = memory_lower_bound(point, 1_000_000, shape, 8, 256, first_moment_bytes=2, weight_bytes=2, optimizer="sgd")
    assert adamw.weights_and_moments == 6 * 1_000_000 / 4  # bf16 weight, first and second moment
    assert sgd.weights_and_moments == 2 * 1_000_000 / 4  # the bf16 weight alone
    assert sgd.block_inputs == adamw.block_inputs


def test_the_optimizer_is_part_of_a_searchs_study_record() -> None:
    from dataclasses import replace

    from tpu_tuner.model.workloads.structure import Dims
    from tpu_tuner.planner.compiler.compile_request import StepSettings
    from tpu_tuner.planner.plans.plan_problem import PlanProblem
    from tpu_tuner.planner.plans.plan_records import plan_record
    from tpu_tuner.planner.plans.plan_space import PlanSpace
    from tpu_tuner.planner.prediction.predict import CostModel
    from tpu_tuner.planner.topology import parse_topology

    problem = PlanProblem(
        source="shape",
        workload="decoder",
        preset=None,
        topology=parse_topology("v5e:2x2"),
        step=StepSettings(8, 256),
        dims=Dims(ModelShape(128, 4, 4, 256, 256, 2), 32),
        gated=True,
        matmul_parameters=1,
        parameters=1,
        model_flops=1.0,
        attention="full",
        fast=True,
        cost_model=CostModel(),
        placements={},
        model_digest="0" * 64,
    )
    adamw, sgd = (
        plan_record(p, PlanSpace(tensors=(1,)))
        for p in (problem, replace(problem, step=replace(problem.step, optimizer="sgd")))
    )
    assert "optimizer" not in adamw and sgd["optimizer"] == "sgd"  # earlier studies keep their records


def test_the_report_names_sgd_and_leaves_adamw_unsaid() -> None:
    from types import SimpleNamespace

    from tpu_tuner.outputs.plan_report import precision

    sgd = precision(SimpleNamespace(weight_dtype="bfloat16", quantization=None, optimizer="sgd"))  # type: ignore[arg-type]
    adamw = precision(SimpleNamespace(weight_dtype="bfloat16", quantization=None, optimizer="adamw"))  # type: ignore[arg-type]
    assert adamw == "bf16 master weights, bf16 matmuls; MFU against the bf16 peak (MaxText's convention)"
    assert sgd == adamw.replace("matmuls;", "matmuls, SGD without momentum (no optimizer state);")


REFUSALS = [
    (["--optimizer", "lion"], "--optimizer takes adamw or sgd, not 'lion'"),
    (["--optimizer", "sgd", "--mu-dtype", "bfloat16"], "--optimizer sgd keeps no moments"),
]


def test_an_unknown_optimizer_is_refused_in_one_line_with_exit_2() -> None:
    code = f"""
        import contextlib, io, json
        from tpu_tuner.cli import main
        results = []
        for flags in {[flags for flags, _ in REFUSALS]!r}:
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                try:
                    status = main(["plan", {TINY!r}, "--topology", "v5e:2x2", *flags, "--seq", "256", "--fast"])
                except SystemExit as exit:
                    status = exit.code
            results.append([status, err.getvalue()])
        print(json.dumps(results))
    """
    for (status, stderr), (_, words) in zip(_last_json(code), REFUSALS):  # type: ignore[arg-type]
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert status == 2 and len(lines) == 1 and words in lines[0], stderr[-2000:]


@needs_planner
@pytest.mark.slow  # two compiles of the tiny decoder in a fresh interpreter: about 20 s here
def test_the_sgd_step_compiles_without_adamws_two_moments() -> None:
    out = _last_json(f"""
        import json
        from tpu_tuner.model.meshes.layouts import Layout
        from tpu_tuner.planner.compiler.compile_request import topology_devices
        from tpu_tuner.planner.plans.hf_plan import planned_workload
        from tpu_tuner.planner.compiler.program import compile_step
        from tpu_tuner.planner.compiler.compile_request import CompileJob, CompileModel, CompileTarget, StepSettings
        from tpu_tuner.planner.plans.plan_space import PlanPoint

        workload = planned_workload({TINY!r})
        devices = topology_devices("v5e:2x2")
        out = {{}}
        for optimizer in ("adamw", "sgd"):
            job = CompileJob(CompileModel({TINY!r}, None, 128, 2, scan=True), CompileTarget("v5e:2x2"),
                             StepSettings(8, 256, optimizer=optimizer), PlanPoint(Layout(1, 4, 1)), fast=True)
            step = compile_step(job, lambda: workload.model_for_preset(None), devices)
            assert step.error is None, step.error
            out[optimizer] = {{"arguments": step.argument_bytes, "peak": step.peak_bytes, "flops": step.flops}}
        print(json.dumps(out))
    """)
    adamw, sgd = out["adamw"], out["sgd"]  # type: ignore[index]
    # Two fp32 moments a parameter, split over fsdp 4 (the 1-D parameters, replicated, add a little).
    moments = 2 * 4 * TINY_MATRIX_PARAMETERS / 4
    assert adamw["arguments"] - sgd["arguments"] == pytest.approx(moments, rel=0.02)
    assert adamw["peak"] - sgd["peak"] >= 0.98 * moments
    # The update is a few elementwise FLOPs a weight: the step's matmuls are the same.
    assert 0 < adamw["flops"] - sgd["flops"] < 0.01 * adamw["flops"]
