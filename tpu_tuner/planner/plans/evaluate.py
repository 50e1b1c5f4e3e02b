"""Points compiled and judged: each point's programs through the compile pool, its whole step's
figures, whether it fits, and its prediction."""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from dataclasses import replace

from tpu_tuner.core.errors import UserInputError, first_text_line
from tpu_tuner.core.failures import is_compiler_out_of_memory, unknown_compile_option
from tpu_tuner.planner.compiler.compile_pool import CompileJob, CompilePool
from tpu_tuner.planner.compiler.compiled_step import (
    CompiledStep,
    add_loop_iterations,
    combine_scanned,
    extrapolate_depth,
)
from tpu_tuner.planner.compiler.remat import parse_remat
from tpu_tuner.planner.compiler.xla_flags import xla_flags_text
from tpu_tuner.planner.plans.plan_problem import PlanProblem
from tpu_tuner.planner.plans.plan_result import LayoutPlan
from tpu_tuner.planner.plans.plan_space import PlanPoint
from tpu_tuner.planner.prediction.attention_kernel import ChipStep
from tpu_tuner.planner.prediction.hbm_estimate import estimate_record
from tpu_tuner.planner.prediction.predict import Prediction, predict

log = logging.getLogger(__name__)


def evaluate(
    problem: PlanProblem,
    points: list[PlanPoint],
    pool: CompilePool,
    emit: Callable[[str], None],
    done: Callable[[PlanPoint, CompiledStep], None] | None = None,
) -> dict[PlanPoint, LayoutPlan]:
    """Compile every point (one program each: every block scanned, its loops measured in its own
    HLO; program.py) and predict it."""
    depth = problem.dims.scanned  # loop iterations: blocks, or repeats of a layer pattern
    jobs = {point: problem.job(point, depth) for point in points}
    by_job = {job: point for point, job in jobs.items()}

    def first_done(job: CompileJob, step: CompiledStep) -> None:
        if done is not None:
            done(by_job[job], step)

    scanned = {by_job[job]: step for job, step in pool.compile(list(jobs.values()), first_done).items()}
    scanned.update(_without_sparsecore_offload(problem, scanned, pool, depth, emit))
    # A second round, only where needed. Block loops that could not be measured: the ends-only
    # program gives one block as the difference (program.combine_scanned; single micro-batch
    # programs only). Loops a full-effort compile peeled (its cost analysis then holds more than
    # one block): the work is read from the same program compiled with the least effort, which
    # does not peel (docs/planner.md, "One compile a layout").
    ends_jobs = {
        p: problem.job(p, 0)
        for p, step in scanned.items()
        if not step.error and step.loop_iteration is None and p.accumulation == 1
    }
    recost_jobs = {
        p: problem.job(p, depth, fast=True)
        for p, step in scanned.items()
        if not step.error and not problem.fast and step.loop_peeled
    }
    # --fast and full effort can disagree on memory near the limit (docs/planner.md: 92.1 against
    # 96.0 GiB on one row): a fast point that close is compiled again at full effort, which decides.
    confirm_jobs = {
        p: problem.job(p, depth, fast=False)
        for p, step in scanned.items()
        if problem.fast and near_limit(step, problem.hbm)
    }
    if confirm_jobs:
        emit(
            f"{len(confirm_jobs)} --fast point{'s are' if len(confirm_jobs) != 1 else ' is'} within "
            f"{NEAR_LIMIT:.0%} of the HBM limit: compiling {'them' if len(confirm_jobs) != 1 else 'it'} at full effort"
        )
    if ends_jobs:
        emit(
            f"{_programs(len(ends_jobs))} block loops could not be measured in {_its(len(ends_jobs))} HLO: "
            f"compiling {_its(len(ends_jobs))} ends alone"
        )
    if recost_jobs:
        emit(
            f"{_programs(len(recost_jobs))} block loops were peeled by the compiler: recompiling "
            f"{'it' if len(recost_jobs) == 1 else 'them'} once for {_its(len(recost_jobs))} work"
        )
    second = pool.compile([*ends_jobs.values(), *recost_jobs.values(), *confirm_jobs.values()])
    decided: dict[PlanPoint, tuple[CompiledStep, str, CompiledStep | None]] = {}
    for point in points:
        step, effort = scanned[point], "fast" if problem.fast else "full"
        confirmed = _step_of(second, confirm_jobs.get(point))
        cost_step = _step_of(second, recost_jobs.get(point))
        if confirmed is not None and (confirmed.error is None or is_compiler_out_of_memory(confirmed.error)):
            # The full-effort program decides memory; the fast one, which never peels, counts the work.
            step, effort = confirmed, f"full effort (the --fast compile was within {NEAR_LIMIT:.0%} of the limit)"
            # Whatever the full-effort program made of its loops (peeled, or a micro-batch loop it
            # unrolled past measuring: Llama 3.1 70B on v6e-32 at 8 micro-batches was refused so).
            cost_step = scanned[point] if not scanned[point].error else None
        decided[point] = (step, effort, cost_step)
    shallow = _unpeeled_by_depth(problem, decided, pool, emit)
    judged_points = {}
    for point, (step, effort, cost_step) in decided.items():
        plan = _judge(problem, point, step, _step_of(second, ends_jobs.get(point)), shallow.get(point, cost_step))
        plan.fit_effort = effort
        judged_points[point] = plan
    return judged_points


def _unpeeled_by_depth(
    problem: PlanProblem,
    decided: dict[PlanPoint, tuple[CompiledStep, str, CompiledStep | None]],
    pool: CompilePool,
    emit: Callable[[str], None],
) -> dict[PlanPoint, CompiledStep]:
    """The work of peeled programs whose unpeeled compile (least effort, full depth) was refused
    (near the HBM limit, where that effort overstates temporaries):
    the least-effort program at a half and a quarter of the depth, which fits, extrapolated to the
    full depth (compiled_step.extrapolate_depth). Without this a peeled program's own count stood
    (70B on two v5p-256 slices: 2.24e15 FLOPs counted where its unpeeled neighbours count 7.3e15)."""
    depth = problem.dims.scanned
    depths = (max(2, depth // 4), depth // 2)
    needed = [
        point
        for point, (step, _, cost_step) in decided.items()
        if not step.error and step.loop_peeled and (cost_step is None or cost_step.error) and depths[0] < depths[1]
    ]
    if not needed:
        return {}
    emit(
        f"{_programs(len(needed))} block loops were peeled and the unpeeled program could not be compiled: counting "
        f"{_its(len(needed))} work from the least-effort program at {depths[0]} and {depths[1]} blocks"
    )
    jobs = {(point, blocks): problem.job(point, blocks, fast=True) for point in needed for blocks in depths}
    compiled = pool.compile(list(jobs.values()))
    found = {}
    for point in needed:
        low, high = (compiled.get(jobs[point, blocks]) for blocks in depths)
        if low is None or high is None or low.error or high.error or high.loop_iteration is None:
            # The peeled program's own count stands, and its plan says so; the log says why.
            why = next((s.error for s in (low, high) if s is not None and s.error), "its block loop was not measured")
            emit(f"{point.name()}: the shallower programs did not count its work either ({first_text_line(why)})")
            continue
        found[point] = extrapolate_depth(low, high, depths, depth)
    return found


NEAR_LIMIT = 0.05  # a --fast peak within this share of the HBM limit (either side) is compiled again
_REFUSED = re.compile(r"\(([\d.]+)([KMGT])\) exceeds available HBM \(([\d.]+)([KMGT])\)")
_UNIT = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


# libtpu 0.0.42 aborts compiling host-offloading TPU7x programs in its SparseCore collective offload
# ("Check failed: std::abs(inc) < core_count()" in offload_collective_strategies.cc: DeepSeek-V3 on
# 4x4x8, docs/planner.md "Memory first"); with the collectives left on the TensorCores they compile.
SPARSECORE_OFFLOAD_OFF: tuple[tuple[str, bool | int | str], ...] = tuple(
    (f"xla_tpu_enable_sparse_core_collective_offload_{kind}", False)
    for kind in ("all_gather", "reduce_scatter", "all_reduce", "2d_all_gather", "3d_all_gather", "nd_reduce_scatter")
)


def _without_sparsecore_offload(
    problem: PlanProblem,
    scanned: dict[PlanPoint, CompiledStep],
    pool: CompilePool,
    depth: int,
    emit: Callable[[str], None],
) -> dict[PlanPoint, CompiledStep]:
    """The host-offloading points whose compile libtpu aborted, compiled once more with the
    SparseCore collective offload off, the user's --xla-flags overridden where they turned it on
    (gpt-oss-120b's published flags do, and its 2-micro-batch points abort with them); each such
    point's plan says so (`CompiledStep.note`), and where the second compile fails too, its own
    reason replaces the abort (a program over the host's memory says more than a crash)."""
    offload_flags = {name for name, _ in SPARSECORE_OFFLOAD_OFF}
    given = dict(problem.step.xla_flags)
    overridden = sorted(n for n in offload_flags & set(given) if str(given[n]).lower() == "true")
    if offload_flags <= set(given) and not overridden:
        return {}  # the user's flags turn it off already: compiled again, it would abort again
    retry = {
        p: replace(job, step=replace(job.step, xla_flags=job.step.xla_flags + SPARSECORE_OFFLOAD_OFF))
        for p, step in scanned.items()
        if step.error and "SIGABRT" in step.error and parse_remat(p.remat).offloads
        for job in (problem.job(p, depth),)
    }
    if not retry:
        return {}
    emit(
        f"libtpu aborted compiling {len(retry)} program{'s' if len(retry) != 1 else ''} that offload to host: "
        f"compiling {'it' if len(retry) == 1 else 'them'} again with the SparseCore collective offload off "
        f"(--xla-flags {' '.join(xla_flags_text(SPARSECORE_OFFLOAD_OFF))})"
        + (f", overriding the {len(overridden)} given --xla-flags that turn it on" if overridden else "")
    )
    note = SPARSECORE_NOTE + ("; the given --xla-flags turned it on" if overridden else "")
    again = pool.compile(list(retry.values()))
    return {
        p: replace(again[job], note=note)
        if not again[job].error
        else replace(
            again[job], error=f"{again[job].error} (compiled again with the SparseCore collective offload off)"
        )
        for p, job in retry.items()
    }


SPARSECORE_NOTE = "compiled with the SparseCore collective offload off (libtpu aborted with it on)"


def _step_of(steps: dict[CompileJob, CompiledStep], job: CompileJob | None) -> CompiledStep | None:
    """The compiled step of `job`, None where the point had no such job (or it did not come back)."""
    return steps.get(job) if job is not None else None


def near_limit(step: CompiledStep, hbm: float) -> bool:
    """Whether a compiled point's peak, or the memory its refusal states, is within NEAR_LIMIT of `hbm`."""
    if step.error:
        found = _REFUSED.search(step.error)
        if not found:
            return False
        needed = float(found.group(1)) * _UNIT[found.group(2)]
        return needed <= hbm * (1 + NEAR_LIMIT)
    return abs(step.peak_bytes - hbm) <= NEAR_LIMIT * hbm


def _judge(
    problem: PlanProblem,
    point: PlanPoint,
    step: CompiledStep,
    ends: CompiledStep | None,
    cost_step: CompiledStep | None,
) -> LayoutPlan:
    """One point's LayoutPlan from its compiled programs."""
    depth = problem.dims.scanned  # loop iterations: blocks, or repeats of a layer pattern
    failed = step if step.error else ends if ends is not None and ends.error else None
    if cost_step is not None and (cost_step.error or cost_step.loop_iteration is None):
        cost_step = None
    # The loops are measured in the program that counts the work: `cost_step` where there is one.
    iteration = (cost_step or step).loop_iteration
    if failed is None and ends is None and iteration is None:
        failed = replace(step, error="the block loops could not be measured in the compiled program")
    if (
        failed is None
        and point.accumulation > 1
        and iteration is not None
        and iteration.micro_batch is None
        and iteration.loops < 2 * point.accumulation
    ):
        # Neither a micro-batch loop around the block loops nor one pair of block loops per
        # micro-batch (unrolled): the work cannot be counted (a model of one block, say).
        failed = replace(step, error="the micro-batch loop could not be measured in the compiled program")
    if failed is not None:
        return judged(problem, point, failed)
    if ends is not None:
        full = combine_scanned(ends, step, depth, cost_step)
    else:
        full = add_loop_iterations(step, depth, cost_step, point.accumulation)
    return judged(problem, point, full)


def _programs(n: int) -> str:
    return "1 program's" if n == 1 else f"{n} programs'"


def _its(n: int) -> str:
    return "its" if n == 1 else "their"


def judged(problem: PlanProblem, point: PlanPoint, full: CompiledStep) -> LayoutPlan:
    """The LayoutPlan of a point from its whole step's compiler figures (or refusal)."""
    hbm = problem.hbm
    bound = problem.lower_bound(point).total
    batch = point.per_device_batch(problem.step.global_batch)
    unknown = unknown_compile_option(full.error or "")
    if unknown and problem.step.xla_flags:
        # Every point would be refused alike: the user's flag, not the point, is wrong.
        raise UserInputError(f"--xla-flags: the TPU compiler has no option {unknown!r}")
    # The point's plan given (fits, margin, why, prediction): the rest is the same either way.
    plan_of = functools.partial(
        LayoutPlan,
        point.layout,
        full,
        remat=point.remat,
        accumulation=point.accumulation,
        flash_block=point.flash_block,
        per_device_batch=batch,
        lower_bound_bytes=bound,
        memory_estimate=estimate_record(problem, point),
    )
    if full.error:
        return plan_of(False, 0.0, f"the compiler refused: {full.error}", None)
    if full.loop_peeled:
        log.warning(
            "%s: the compiler peeled the block loop; per-block work may count more than one block", point.name()
        )
    if bound > full.peak_bytes * 1.001:
        log.error(
            "%s: the memory lower bound (%.2f GiB) is above the compiled peak (%.2f GiB): the bound is wrong "
            "and may have ruled out points that fit",
            point.name(),
            bound / 2**30,
            full.peak_bytes / 2**30,
        )
    fits = full.fits_in(hbm)
    over_but_accepted = fits and full.peak_bytes > hbm  # an offloading program: its allocation overstates
    why = (
        (
            f"the compiler's peak {full.compiler_peak_bytes / 2**30:.1f} GiB of live buffers; allocated: "
            if full.compiler_peak_bytes
            else ""
        )
        + f"arguments (weights + optimizer state) {full.argument_bytes / 2**30:.1f} GiB + temporaries "
        f"(activations, gathered weights) {full.temp_bytes / 2**30:.1f} GiB + outputs "
        f"{(full.output_bytes - full.alias_bytes) / 2**30:.1f} GiB vs {hbm / 2**30:.2f} GiB HBM limit"
        + (f"; {full.host_temp_bytes / 2**30:.1f} GiB offloaded to host memory" if full.host_temp_bytes else "")
        + (
            "; the allocation is over the limit, but the compiler, which refuses an offloading program over "
            "its HBM limit, accepted it"
            if over_but_accepted
            else ""
        )
        + (
            "; the compiler peeled the block loop and its unpeeled program could not be compiled, so FLOPs / bytes / "
            "collectives may not be one block's"
            if full.loop_peeled
            else ""
        )
        + (f"; {full.note}" if full.note else "")
    )
    prediction = predicted(problem, point, full)
    # The margin of an accepted program over its allocation is not known: 0, at the limit.
    margin = 0.0 if over_but_accepted else hbm - full.peak_bytes
    return plan_of(fits, margin, why, prediction, over_limit_accepted=over_but_accepted)


def predicted(problem: PlanProblem, point: PlanPoint, full: CompiledStep, chip: ChipStep | None = None) -> Prediction:
    """The prediction of `point` from its whole step's compiler figures; `chip`: step constants in
    place of the chip's kept ones (`PlanProblem.chip_step`; benchmarks/chip/tpu_chip_check.py fits them)."""
    devices = problem.topology.devices
    return predict(
        full,
        problem.topology,
        point.layout,
        problem.dims.shape,
        problem.dims.head_dim,
        problem.model_flops / devices,
        problem.step.global_batch * problem.step.seq_len,
        problem.cost_model,
        problem.hardware_flops(point.remat) / devices,
        problem.step.seq_len,
        problem.step.quantization,
        problem.quantized_share(),
        moe=problem.moe,  # a dropless step runs at its own fitted efficiency (docs/planner.md, "Calibration")
        routed_per_token=problem.routed_per_token,  # or is charged passes over its routed tokens ("+route")
        kernel=problem.attention_kernel(point),
        chip=chip or problem.chip_step(point),
    )


__all__ = ["evaluate", "judged", "predicted"]
