"""`tpu-tune plan`: rank sharding layouts for a TPU slice, without owning one.

For each layout the TPU compiler itself (libtpu, ahead of time, on this CPU) reports per-device
memory, FLOPs, HBM bytes and collectives; `predict.py` turns them into step time and MFU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.field_types import check_field_types
from tpu_tuner.model.meshes.layouts import Layout, enumerate_layouts, with_expert_axes
from tpu_tuner.planner.compiler.compile_pool import CompilePool
from tpu_tuner.planner.compiler.compiled_step import CompiledStep
from tpu_tuner.planner.compiler.remat import parse_remat
from tpu_tuner.planner.plans.evaluate import evaluate, judged
from tpu_tuner.planner.plans.fits_first import choose, layout_preference, widened
from tpu_tuner.planner.plans.plan_options import PlanOptions
from tpu_tuner.planner.plans.plan_problem import PlanProblem, build_problem
from tpu_tuner.planner.plans.plan_result import LayoutPlan, PlanResult, attention_layers, result_of
from tpu_tuner.planner.plans.plan_search import search
from tpu_tuner.planner.plans.plan_space import DEFAULT_REMATS, PlanPoint, invalid_reason
from tpu_tuner.planner.plans.step_options import DefaultAccumulation, DefaultRemat


def plan(model_file: str | Path, options: PlanOptions, progress: Callable[[str], None] | None = None) -> PlanResult:
    """Plan `model_file` on `options.target`: the layout enumeration, or with `options.search.budget`
    (or the grid sampler) the search over the joint space."""
    started = time.perf_counter()
    check_field_types(options)
    topology = options.target.slice()
    # The compiler processes start now: their start-up overlaps reading the model.
    with CompilePool(options.compile.workers, options.compile.log_file, options.compile.compile_timeout_s) as pool:
        emit = progress or (lambda message: None)
        problem = build_problem(model_file, options, topology, emit)
        emit(f"attention: {attention_layers(problem)}")  # what each layer group runs, as the FLOPs count it
        if options.search.active:
            return search(problem, options, pool, emit, started)
        return enumerated(problem, options, pool, emit, started)


def enumerated(
    problem: PlanProblem, options: PlanOptions, pool: CompilePool, emit: Callable[[str], None], started: float
) -> PlanResult:
    """The plan of `options.enumeration.layouts`, or of the first `max_layouts` enumerated layouts, each with
    the options' remat policy and micro-batch count."""
    shape = problem.dims.shape
    remat = parse_remat(options.step.remat).name
    if options.enumeration.layouts:
        rejected: list[tuple[Layout, str]] = []
        points = [PlanPoint(layout, remat, options.step.accumulation) for layout in options.enumeration.layouts]
    else:
        candidates, rejected = candidate_layouts(problem, options.step.accumulation)
        # Memory first: only layouts estimated to fit compile, the best-predicted first (fits_first.py);
        # where none does, other remat policies and micro-batches the user left to the planner.
        enumerated_points = [PlanPoint(layout, remat, options.step.accumulation) for layout in candidates]
        remats = DEFAULT_REMATS if isinstance(options.step.remat, DefaultRemat) else (remat,)
        steps = WIDENED_ACCUMULATIONS if isinstance(options.step.accumulation, DefaultAccumulation) else None
        points, unfit = choose(
            problem,
            enumerated_points,
            options.enumeration.max_layouts,
            emit,
            lambda: widened(problem, enumerated_points, remats, steps or (options.step.accumulation,)),
        )
        rejected += [(point.layout, why) for point, why in unfit]
    if not points:
        raise UserInputError(
            f"no layout divides this model or fits it on {problem.topology.devices} devices: "
            + "; ".join(r for _, r in rejected[:3])
        )
    for point in points:
        reason = invalid_reason(point, shape, problem.step.global_batch, problem.step.seq_len, problem.step.flash_block)
        if reason:
            raise UserInputError(f"{point.layout.short()}: {reason}")
    emit(f"compiling {len(points)} layouts for {problem.topology.jax_name} on {pool.workers} compiler processes")
    counter = iter(range(1, len(points) + 1))

    def done(point: PlanPoint, step: CompiledStep) -> None:
        status = "refused" if step.error else f"compiled in {step.compile_seconds:.0f} s"
        emit(f"[{next(counter)}/{len(points)}] {point.layout.name()}: {status} ({time.perf_counter() - started:.0f} s)")

    evaluated = evaluate(problem, points, pool, emit, done)
    plans = sorted(evaluated.values(), key=lambda p: (not p.fits, -p.predicted_mfu))
    policies = sorted({p.remat for p in points})  # more than one where the enumeration widened
    return result_of(problem, plans, rejected, " / ".join(policies), started)


# The micro-batch counts a widened enumeration tries (1 to 16: DeepSeek-V3's fitting points need 8 or 16).
WIDENED_ACCUMULATIONS = (1, 2, 4, 8, 16)


def candidate_layouts(problem: PlanProblem, accumulation: int = 1) -> tuple[list[Layout], list[tuple[Layout, str]]]:
    """The enumeration's layouts, in the order practitioners reach for them (`fits_first.
    layout_preference`), and those left out with why: every data x fsdp x tensor factorisation
    that divides the model and its micro-batch, a capacity-routed mixture of experts' expert axes
    too (model/meshes/layouts.with_expert_axes), less those whose weights alone overflow HBM."""
    shape, step = problem.dims.shape, problem.step
    candidates, rejected = enumerate_layouts(
        problem.topology.devices,
        shape,
        step.global_batch // max(1, accumulation),
        step.seq_len,
        slices=problem.topology.slices,
    )
    # A dropless MoE gets none: its grouped matmuls gather every expert's weights over the expert
    # axis as over fsdp (compiler/grouped_matmul.py has no all-to-all), so the axis saves it nothing.
    if problem.dims.experts and problem.moe != "dropless":
        candidates += [
            layout
            for layout in with_expert_axes(candidates, problem.dims.experts)
            if invalid_reason(PlanPoint(layout), shape, step.global_batch, step.seq_len) is None
        ]
    candidates, too_big = _weights_fit(candidates, problem)
    return sorted(candidates, key=layout_preference), rejected + too_big


def _weights_fit(layouts: list[Layout], problem: PlanProblem) -> tuple[list[Layout], list[tuple[Layout, str]]]:
    """Drop, without compiling, layouts whose weights and optimizer state alone (in the problem's
    dtypes, AdamW's two moments or SGD's none, split over fsdp x context x tensor, replicated over
    data: the first term of its memory lower bound, space.memory_lower_bound) exceed a device's
    HBM: a lower bound on the compiler's argument bytes, so nothing that could fit is dropped."""
    keep, drop = [], []
    hbm = problem.hbm
    state = "AdamW moments" if problem.step.optimizer == "adamw" else "optimizer state"
    for layout in layouts:
        need = problem.lower_bound(PlanPoint(layout)).weights_and_moments
        if need > hbm:
            reason = f"the weights + {state} alone need {need / 2**30:.0f} GiB per device (> {hbm / 2**30:.0f} GiB HBM)"
            drop.append((layout, reason))
        else:
            keep.append(layout)
    return keep, drop


# The planner's public names, importable from here.
__all__ = ["LayoutPlan", "PlanOptions", "PlanProblem", "PlanResult", "enumerated", "evaluate", "judged", "plan"]
