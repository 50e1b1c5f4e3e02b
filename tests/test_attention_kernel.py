"""Issue 57 item 4, the chip's own step: where a chip timed the planner's flash attention kernel
(attention_kernel.py, chip_kernels.json), a step's attention is costed from those timings (forward,
recomputed forward, backward) instead of its FLOPs at the matmuls' efficiency; the planner chooses
the block size from them; elsewhere the prediction is unchanged."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from helpers.tiny_planner import planner_problem

from tpu_tuner.model.decoders.transformer_dims import AttentionSpan
from tpu_tuner.model.meshes.layouts import Layout, ModelShape
from tpu_tuner.model.workloads.structure import Dims
from tpu_tuner.planner.compiler.compiled_step import CompiledStep
from tpu_tuner.planner.plans import plan_problem
from tpu_tuner.planner.plans.plan_problem import chosen_flash_block
from tpu_tuner.planner.plans.plan_space import PlanPoint
from tpu_tuner.planner.prediction.attention_kernel import (
    KERNELS_FILE,
    ChipKernels,
    ChipStep,
    KernelTiming,
    attention_kernel_work,
    chip_kernels,
)
from tpu_tuner.planner.prediction.predict import CostModel, predict
from tpu_tuner.planner.topology import parse_topology

# A made-up chip: 512 blocks twice as fast as 128, 1024 2% faster than 512; time ~ seq^2.
TIMINGS = tuple(
    KernelTiming(128, seq, block, 64, ms * (seq / 1024) ** 2, 5 * ms * (seq / 1024) ** 2)
    for seq in (1024, 2048)
    for block, ms in ((128, 2.0), (512, 1.0), (1024, 0.98))
    if seq % block == 0
)
STEP = ChipStep(efficiency=0.6, recompute_weight=0.3, devices=1, fitted_to="a made-up fit")
KERNELS = ChipKernels("v5e", "TPU v5 lite", "2026-12-06", "0.10.2", "0.0.42", TIMINGS, STEP)


def test_a_layer_is_its_forwards_and_its_backward_per_head() -> None:
    # 2048 timed: forward 4 ms, backward 16 ms over 64 heads; 128 heads, forward recomputed.
    assert KERNELS.seconds(128, 2048, 512, 128, forwards=2) == pytest.approx((2 * 4 + 16) * 2 / 1e3)
    assert KERNELS.seconds(128, 2048, 512, 128, forwards=1) == pytest.approx((4 + 16) * 2 / 1e3)
    assert KERNELS.seconds(128, 2048, 256, 128, forwards=2) is None  # a block not timed


def test_untimed_sequences_follow_the_timed_ones_log_log() -> None:
    at_1024, at_2048 = (KERNELS.seconds(128, s, 512, 64, 1) for s in (1024, 2048))
    assert at_1024 is not None and at_2048 is not None
    assert KERNELS.seconds(128, 4096, 512, 64, 1) == pytest.approx(at_2048 * 4)  # the end slope: squared
    assert KERNELS.seconds(128, 1448, 512, 64, 1) == pytest.approx(at_1024 * (1448 / 1024) ** 2)


def test_a_narrower_head_costs_as_the_timed_width_and_a_wider_one_in_proportion() -> None:
    base = KERNELS.seconds(128, 2048, 512, 64, 2)
    assert base is not None
    assert KERNELS.seconds(64, 2048, 512, 64, 2) == pytest.approx(base)  # the same 128-lane tiles
    assert KERNELS.seconds(256, 2048, 512, 64, 2) == pytest.approx(2 * base)


def test_the_planner_chooses_the_fastest_block_or_maxtexts_512_within_5_percent(monkeypatch) -> None:
    monkeypatch.setattr(plan_problem, "chip_kernels", lambda generation: KERNELS if generation == "v5e" else None)
    assert KERNELS.fastest_block(128, 2048) == 1024
    assert chosen_flash_block(parse_topology("v5e-1"), 128, 2048) == 512  # 1024 is only 2% faster
    slower_512 = replace(
        KERNELS, timings=tuple(replace(t, forward_ms=t.forward_ms * 1.2) if t.block == 512 else t for t in TIMINGS)
    )
    monkeypatch.setattr(plan_problem, "chip_kernels", lambda generation: slower_512)
    assert chosen_flash_block(parse_topology("v5e-1"), 128, 2048) == 1024
    monkeypatch.setattr(plan_problem, "chip_kernels", lambda generation: None)
    assert chosen_flash_block(parse_topology("v6e-8"), 128, 2048) is None  # no timings: the kernel's default


def _problem(**changes):
    dims = Dims(ModelShape(1024, 8, 8, 4096, 32000, 16), 128, scanned=16)
    problem = planner_problem(dims, topology="v5e-1", devices=1, source="decoder:d_model=1024")
    return replace(problem, step=replace(problem.step, global_batch=8, seq_len=2048), **changes)


def test_the_step_attention_is_costed_from_the_timings_only_where_they_apply(monkeypatch) -> None:
    monkeypatch.setattr(plan_problem, "chip_kernels", lambda generation: KERNELS if generation == "v5e" else None)
    problem = _problem(chosen_flash_block=512)
    point = PlanPoint(Layout(1, 1, 1), "full", 1)
    work = problem.attention_kernel(point)
    assert work is not None and work.block == 512
    assert work.seconds == pytest.approx(16 * KERNELS.seconds(128, 2048, 512, 8 * 8, 2))  # 16 layers
    assert problem.attention_kernel(PlanPoint(Layout(1, 1, 1), "minimal_with_context", 1)).seconds < work.seconds
    assert problem.attention_kernel(PlanPoint(Layout(1, 1, 1, context=2), "full", 1)) is None
    local = replace(problem, spans=(AttentionSpan(8, 128, window=512),) * 16)
    assert local.attention_kernel(point) is None  # a sliding window: splash's kernel, not timed
    assert replace(problem, moe="dropless").attention_kernel(point) is None  # the chip's steps were dense
    assert replace(problem, chosen_flash_block=None).attention_kernel(point).block == 128  # the kernel's default
    # On a slice larger than the chip's measured steps, attention stays FLOPs (the calibration's model).
    on_four = replace(problem, topology=parse_topology("v5e-4").as_compiled(4, 16 * 2**30))
    assert on_four.attention_kernel(PlanPoint(Layout(1, 4, 1), "full", 1)) is None
    no_steps = replace(KERNELS, step=None)
    monkeypatch.setattr(plan_problem, "chip_kernels", lambda generation: no_steps)
    assert problem.attention_kernel(point) is None


def test_the_prediction_pays_the_kernel_instead_of_attentions_flops() -> None:
    shape = ModelShape(1024, 8, 8, 4096, 32000, 16)
    topology = parse_topology("v5e-1")
    work = attention_kernel_work(
        KERNELS, layers=16, heads=8, head_dim=128, seq=2048, block=512, sequences_per_device=8, recomputed=True
    )
    assert work is not None
    compiled = CompiledStep(4e13, 3e11, 0.0, 0.0, 0.0, 0.0)
    cost = CostModel(mxu_efficiency=0.7, memory_overlap=0.8, score_flops=0.0)
    args = (compiled, topology, Layout(1, 1, 1), shape, 128, 3.6e13, 8 * 2048, cost, 0.0, 2048)
    without = predict(*args)
    with_kernel = predict(*args, kernel=work)
    assert with_kernel.attention_kernel_seconds == pytest.approx(work.seconds)
    # The forward kernels' estimated FLOPs leave the matmul work; the timed seconds join it.
    matmuls = (4e13 - work.counted_flops) / (197e12 * 0.7)
    assert with_kernel.compute_seconds == pytest.approx(matmuls + work.seconds, rel=1e-6)
    assert with_kernel.step_seconds != pytest.approx(without.step_seconds)


def test_the_kept_timings_say_their_chip_date_and_libtpu() -> None:
    kept = json.loads(KERNELS_FILE.read_text())
    assert set(kept) == {"v5e"}
    record = kept["v5e"]
    assert record["device"] == "TPU v5 lite" and record["date"] and record["libtpu"] and record["jax"]
    kernels = chip_kernels("v5e")
    timed = [row for row in record["rows"] if "forward_backward_ms" in row]  # the rest: the kernel refused (VMEM)
    assert kernels is not None and len(kernels.timings) == len(timed) >= 40
    assert {t.block for t in kernels.timings} >= {128, 512} and {t.head_dim for t in kernels.timings} >= {64, 128}
    assert chip_kernels("v6e") is None


def test_the_chips_step_constants_apply_on_a_slice_of_the_measured_size_only(monkeypatch) -> None:
    monkeypatch.setattr(plan_problem, "chip_kernels", lambda generation: KERNELS if generation == "v5e" else None)
    problem = _problem(chosen_flash_block=512)
    full, minimal = (PlanPoint(Layout(1, 1, 1), remat, 1) for remat in ("full", "minimal"))
    assert problem.recomputed_flops(minimal) == 0
    # Full remat recomputes the four projections and the gated MLP's three matmuls, not attention's
    # forward (the kernel's): 2 x 1024 x 1024 x 4 + 3 x 2 x 1024 x 4096 a token a layer.
    assert problem.gated
    per_token = 2 * 1024 * 1024 * 4 + 3 * 2 * 1024 * 4096
    assert problem.recomputed_flops(full) == pytest.approx(per_token * 16 * 8 * 2048)
    chip = problem.chip_step(full)
    assert chip is not None and chip.recomputed_flops == problem.recomputed_flops(full)
    on_four = replace(problem, topology=parse_topology("v5e-4").as_compiled(4, 16 * 2**30))
    assert on_four.chip_step(PlanPoint(Layout(1, 4, 1), "full", 1)) is None  # measured on one chip only
    assert replace(problem, moe="dropless").chip_step(full) is None


def test_the_chips_step_replaces_the_efficiency_and_weighs_recomputation() -> None:
    shape = ModelShape(1024, 8, 8, 4096, 32000, 16)
    topology = parse_topology("v5e-1")
    compiled = CompiledStep(4e13, 1e9, 0.0, 0.0, 0.0, 0.0)  # bytes negligible: compute alone
    cost = CostModel(mxu_efficiency=0.8, memory_overlap=1.0, score_flops=0.0)
    args = (compiled, topology, Layout(1, 1, 1), shape, 128, 3.6e13, 8 * 2048, cost, 0.0)
    plain = predict(*args)
    chip = ChipStep(efficiency=0.6, recompute_weight=0.25, devices=1, fitted_to="", recomputed_flops=8e12)
    with_chip = predict(*args, chip=chip)
    aligned = plain.alignment
    assert plain.compute_seconds == pytest.approx(4e13 / aligned / 197e12 / 0.8)
    assert with_chip.compute_seconds == pytest.approx((4e13 - 0.75 * 8e12) / aligned / 197e12 / 0.6)


def test_the_kept_chip_step_says_what_it_was_fitted_to() -> None:
    kernels = chip_kernels("v5e")
    assert kernels is not None and kernels.step is not None
    assert kernels.step.devices == 1 and 0 < kernels.step.recompute_weight <= 1 and 0.3 < kernels.step.efficiency < 1
    assert "steps" in kernels.step.fitted_to and "left out" in kernels.step.fitted_to


def test_a_search_study_records_the_blocks_the_planner_chose() -> None:
    from tpu_tuner.planner.plans.plan_records import plan_record
    from tpu_tuner.planner.plans.plan_space import PlanSpace

    space = PlanSpace(tensors=(1,), contexts=(1,), datas=(1,), remats=("full",), accumulations=(1,))
    chosen, unchosen = _problem(chosen_flash_block=512), _problem()
    assert plan_record(chosen, space)["chosen_flash_block"] == 512
    assert "chosen_flash_block" not in plan_record(unchosen, space)  # earlier studies keep their record
