"""The HBM estimate's terms for what the TPU compiler does beyond the model (issue 57 item 1): the
logits' cotangent held through the backward loop where the FSDP collectives are windowed (fsdp
groups of at most 32 devices), and the extra copies of the routed rows that dropless routing
keeps beside capacity routing's. Nothing here compiles."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers.tiny_planner import planner_problem

from tpu_tuner.model.meshes.layouts import Layout, ModelShape
from tpu_tuner.model.workloads.structure import Dims
from tpu_tuner.planner.compiler.compile_request import StepSettings
from tpu_tuner.planner.plans.plan_problem import PlanProblem
from tpu_tuner.planner.plans.plan_space import PlanPoint
from tpu_tuner.planner.prediction.hbm_estimate import BF16, FITTED, WINDOWED_FSDP, Fitted, estimate

SHAPE = ModelShape(64, 4, 2, 128, 1024, 2)
UNIT = Fitted(activations=(("full", 1.0),))  # every constant at one


def _problem(dims: Dims, batch: int = 256, seq: int = 1024) -> PlanProblem:
    return planner_problem(dims, devices=64, hbm_gib=8, step=StepSettings(batch, seq))


def test_a_windowed_program_holds_the_logits_cotangent_through_the_backward() -> None:
    problem = _problem(Dims(SHAPE, 16))
    unheld = replace(UNIT, held_cotangent=0.0)
    for fsdp in (8, WINDOWED_FSDP):
        point = PlanPoint(Layout(64 // fsdp, fsdp, 1))
        tokens = 256 / 64 * 1024
        added = estimate(problem, point, UNIT).logits - estimate(problem, point, unheld).logits
        assert added == pytest.approx(BF16 * tokens * 1024)  # a bf16 [tokens, vocab] cotangent
        # Split over tensor and tiled like the logits themselves.
        tiled = replace(problem, step=replace(problem.step, vocab_tiling=4))
        assert estimate(tiled, point, UNIT).logits - estimate(tiled, point, unheld).logits == pytest.approx(added / 4)
    # fsdp 64: the compiler keeps the collectives whole (no windowed loops), nothing held.
    wide = PlanPoint(Layout(1, 64, 1))
    assert estimate(problem, wide, UNIT).logits == estimate(problem, wide, unheld).logits
    assert FITTED.held_cotangent == 1.0  # one copy, as the buffer assignment counts it (not fitted)


def test_dropless_routing_keeps_more_copies_of_the_routed_rows() -> None:
    point = PlanPoint(Layout(1, 64, 1))
    dense = _problem(Dims(SHAPE, 16))
    dropless = _problem(Dims(SHAPE, 16, experts=8, top_k=2))
    dropping = _problem(Dims(SHAPE, 16, experts=8, top_k=2, capacity_factor=1.0))
    tokens = 256 / 64 * 1024
    no_extra = replace(UNIT, dropless=0.0)
    # The extra copies only under dropless routing: a d_model-wide bf16 row a choice.
    extra = estimate(dropless, point, UNIT).total - estimate(dropless, point, no_extra).total
    assert extra == pytest.approx(BF16 * tokens * 2 * 64)
    assert estimate(dropping, point, UNIT).total == estimate(dropping, point, no_extra).total
    assert estimate(dense, point, UNIT).total == estimate(dense, point, no_extra).total
    # The fit: dropless keeps about twice the copies capacity routing does (6.3 + 5.9 against 6.3).
    assert FITTED.dropless > 0.5 * FITTED.dispatch
