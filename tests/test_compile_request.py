"""Issue 58 item 2: one compile request from the options to the worker and the plan's record. Every
field of the step (request.StepSettings) comes from the options' field of its name, reaches the
job the worker compiles, and is in the plan's study record, with no list of fields between; and
a slice count the target cannot form is refused once, in one line."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pytest

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.model.meshes.layouts import Layout
from tpu_tuner.planner.compiler.compile_request import StepSettings
from tpu_tuner.planner.plans.plan_options import PlanCompile, PlanOptions, PlanStep, PlanTarget
from tpu_tuner.planner.plans.plan_records import plan_record
from tpu_tuner.planner.plans.plan_space import PlanPoint, PlanSpace

# A value unlike each field's default, for the options that set it.
CHANGED: dict[str, Any] = {
    "first_moment_dtype": "bfloat16",
    "weight_dtype": "bfloat16",
    "optimizer": "adamw",  # sgd keeps no first moment to set: its own row below
    "quantization": "int8",
    "vocab_tiling": 4,
    "xla_flags": (("xla_tpu_scoped_vmem_limit_kib", 81920),),
}


def test_every_step_field_flows_from_the_options_to_the_job_and_the_record() -> None:
    from helpers.tiny_planner import tiny_llama_problem

    options = PlanOptions(
        PlanTarget("v5e-4"),
        step=PlanStep(**{k: v for k, v in CHANGED.items() if k in {f.name for f in fields(PlanStep)}}),
        compile=PlanCompile(workers=1, xla_flags=CHANGED["xla_flags"]),
    )
    step = StepSettings.of(options, global_batch=16, seq_len=128)
    taken = {f.name for f in fields(StepSettings)} - {"global_batch", "seq_len", "flash_block"}
    assert {name: getattr(step, name) for name in taken} == {name: CHANGED[name] for name in taken}
    sgd = StepSettings.of(PlanOptions(PlanTarget("v5e-4"), step=PlanStep(optimizer="sgd")), 16, 128)
    assert sgd.optimizer == "sgd" and sgd.first_moment_dtype == "float32"

    # The job a point compiles carries the plan's step whole; the record holds every field of it
    # that differs from its default (a field added later keeps earlier studies' names).
    problem = tiny_llama_problem()
    full = StepSettings(16, 128, **{**CHANGED, "optimizer": "sgd"}, flash_block=512)
    from dataclasses import replace

    problem = replace(problem, step=full)
    assert problem.job(PlanPoint(Layout(1, 8, 1)), 2).step is full
    record = plan_record(problem, PlanSpace((1,)))
    assert {f.name for f in fields(StepSettings)} <= record.keys()
    assert record["xla_flags"] == ["--xla_tpu_scoped_vmem_limit_kib=81920"]  # as LIBTPU_INIT_ARGS spells it
    assert StepSettings(16, 128).record() == {"global_batch": 16, "seq_len": 128, "first_moment_dtype": "float32"}


@pytest.mark.parametrize("slices", [0, -1])
def test_a_bad_slice_count_is_refused_once_in_one_line(slices: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from tpu_tuner.planner import topology

    calls: list[int] = []
    real = topology.Topology.with_slices
    monkeypatch.setattr(topology.Topology, "with_slices", lambda self, n: calls.append(n) or real(self, n))
    with pytest.raises(UserInputError) as refused:
        PlanOptions(PlanTarget("v5e-4", slices=slices))
    assert str(refused.value) == f"--slices must be at least 1, not {slices}" and calls == [slices]
