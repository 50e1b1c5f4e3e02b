"""The HBM estimate's terms for mixtures of experts and side lookup tables (issue 57 item 1), and
what read_dims reads for them: the generic decoder's key/value heads, its experts' routing and its
per-layer input tables. Nothing here compiles."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers.tiny_planner import planner_problem

from tpu_tuner.model.meshes.layouts import Layout, ModelShape
from tpu_tuner.model.workloads.structure import Dims, read_dims
from tpu_tuner.planner.compiler.compile_request import StepSettings
from tpu_tuner.planner.plans.hf_plan import planned_workload
from tpu_tuner.planner.plans.plan_problem import PlanProblem
from tpu_tuner.planner.plans.plan_space import PlanPoint
from tpu_tuner.planner.prediction.hbm_estimate import BF16, Fitted, estimate, moe_dispatch_width

BASE = "decoder:vocab=1024,d_model=64,layers=2,heads=4,kv_heads=2,mlp=128,max_seq_len=256"
POINT = PlanPoint(Layout(1, 8, 1))


def _dims(spec: str) -> Dims:
    workload = planned_workload(spec)
    with torch.device("meta"):
        model = workload.model_for_preset(None)
    transformer = workload.dims_for_preset(None)
    return read_dims(model, transformer.heads if transformer else None)  # the planner's reading (problem.py)


def _problem(dims: Dims, seq: int = 1024) -> PlanProblem:
    return planner_problem(dims, hbm_gib=8, step=StepSettings(16, seq))


def test_read_dims_reads_the_generic_decoders_kv_heads_experts_and_side_tables() -> None:
    dense = _dims(BASE)
    assert (dense.shape.n_heads, dense.shape.n_kv_heads) == (4, 2)  # GQA: not the query heads' count
    assert (dense.experts, dense.top_k, dense.capacity_factor, dense.side_table_parameters) == (0, 0, 0.0, 0)
    dropping = _dims(BASE + ",experts=4,top_k=2,capacity_factor=1.5")
    assert (dropping.experts, dropping.top_k, dropping.capacity_factor) == (4, 2, 1.5)
    dropless = _dims(BASE + ",experts=4,top_k=2,moe_routing=dropless")
    assert (dropless.experts, dropless.top_k, dropless.capacity_factor) == (4, 2, 0.0)
    per_layer = _dims(BASE + ",per_layer_input=8")
    # A second table of layers x 8 columns, one row a token id; the token embedding is not counted.
    assert (per_layer.side_table_parameters, per_layer.side_table_width) == (1024 * 2 * 8, 2 * 8)


def test_the_moe_dispatch_counts_a_row_a_choice_and_capacity_routings_masks() -> None:
    shape = ModelShape(64, 4, 2, 128, 1024, 2)
    dense = _problem(Dims(shape, 16))
    assert moe_dispatch_width(dense) == 0.0
    dropless = _problem(Dims(shape, 16, experts=8, top_k=2))
    assert moe_dispatch_width(dropless) == 2 * 64
    dropping = _problem(Dims(shape, 16, experts=8, top_k=2, capacity_factor=1.25), seq=1024)
    # 2.5 slots a token, d_model wide, and its share of the [tokens, experts x capacity] masks.
    assert moe_dispatch_width(dropping) == pytest.approx(2.5 * 64 + 1024 * 2.5)
    # Only the dispatch constant moves the estimate by the routed rows: tokens a device x width x bf16.
    unit = Fitted(dispatch=1.0, activations=(("full", 0.0),))
    without = replace(unit, dispatch=0.0)
    tokens = 16 * 1024 / 8
    added = estimate(dropless, POINT, unit).total - estimate(dropless, POINT, without).total
    assert added == pytest.approx(BF16 * tokens * 2 * 64)
    assert estimate(dense, POINT, unit).total == estimate(dense, POINT, without).total


def test_an_expert_axis_splits_the_gathered_layer_under_capacity_routing_only() -> None:
    """Capacity routing's einsums move tokens to the experts over the expert axis, so a layer gathers
    its share of the experts; dropless routing's grouped matmuls gather every expert (compiler/
    grouped_matmul.py), so its gathered layer is the FSDP layout's."""
    shape = ModelShape(64, 4, 2, 128, 1024, 2)
    on_fsdp, on_experts = PlanPoint(Layout(1, 8, 1)), PlanPoint(Layout(1, 4, 1, expert=2))
    for moe, split in (("dropping", True), ("dropless", False)):
        problem = replace(_problem(Dims(shape, 16, experts=8, top_k=2, capacity_factor=1.25)), moe=moe)
        fsdp, expert = (estimate(problem, p).gathered for p in (on_fsdp, on_experts))
        assert (expert < fsdp) == split and (expert == fsdp) != split, moe


def test_side_tables_count_their_whole_gradient_and_the_per_layer_inputs() -> None:
    shape = ModelShape(64, 4, 2, 128, 1024, 2)
    plain = _problem(Dims(shape, 16))
    tables = _problem(Dims(shape, 16, side_table_parameters=1_000_000, side_table_width=32))
    unit = Fitted(side_tables=1.0)
    added = estimate(tables, POINT, unit).total - estimate(plain, POINT, unit).total
    tokens = 16 * 1024 / 8
    # Two whole bf16 tables (not split over fsdp), the inputs in bf16 with three fp32 buffers.
    assert added == pytest.approx(2 * BF16 * 1_000_000 + (BF16 + 12) * tokens * 32)
    assert estimate(tables, POINT, replace(unit, side_tables=0.0)).total == estimate(plain, POINT, unit).total
