"""Memory first: which points are worth a compile, in what order, and what would make one fit.

Every candidate gets its HBM estimate (memory_estimate.py) before any compile. Points estimated
above `FIT_MARGIN` of the compiler's limit are not compiled; those below are ordered by what
predicts a faster step before compiling: less recomputation (the remat policy's hardware FLOPs),
fewer micro-batches (a larger per-device batch), then the enumeration's layout preference.
When nothing is estimated to fit, one line names the smallest single change that would: another
remat policy (host offload among them), more micro-batches (a smaller per-device batch), or a
slice twice as large; and the closest point is still compiled, so a plan never silently plans
nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from tpu_tuner.model.meshes.layouts import Layout
from tpu_tuner.planner.plans.plan_problem import PlanProblem
from tpu_tuner.planner.plans.plan_space import DEFAULT_REMATS, PlanPoint, invalid_reason
from tpu_tuner.planner.prediction.hbm_estimate import FIT_MARGIN, MemoryEstimate, estimate

# What a change costs, for choosing the smallest: a remat policy its recomputed FLOPs' share of the
# step, a doubling of micro-batches this much (the same work in smaller matmuls), a slice twice
# the chips 1.0 (twice the price for the same step).
MICRO_BATCH_COST = 0.05
LARGER_SLICE_COST = 1.0


def layout_preference(layout: Layout) -> tuple:
    """The enumeration's order of layouts (FSDP-heavy, small tensor axes, little pure data)."""
    return (layout.tensor > 8, layout.data // layout.dcn_data, layout.tensor, -layout.fsdp)


def outside_the_rows(problem: PlanProblem, point: PlanPoint) -> bool:
    """Whether the estimate has no calibration row like `point`: a dropless mixture of experts on a
    tensor axis. Every kept dropless row has tensor 1, and gpt-oss-120b's widened points on tensor
    2 and 4 compiled at 1.4-2.2x their estimate (105-180 GiB against 66-81; benchmarks/
    plan_fits_first.json), so such points are compiled after those the estimate has seen."""
    return problem.moe == "dropless" and point.layout.tensor > 1


def precompile_key(problem: PlanProblem, point: PlanPoint) -> tuple:
    """Sort key: points like the calibration's first, then the point predicted fastest before any compile."""
    return (
        outside_the_rows(problem, point),
        problem.hardware_flops(point.remat),
        point.accumulation,
        layout_preference(point.layout),
    )


def fits_first(
    problem: PlanProblem, points: Sequence[PlanPoint]
) -> tuple[list[PlanPoint], dict[PlanPoint, MemoryEstimate]]:
    """(the points estimated to fit, best-predicted first; every point's estimate)."""
    estimates = {p: estimate(problem, p) for p in points}
    fitting = [p for p in points if estimates[p].fits(problem.hbm)]
    return sorted(fitting, key=lambda p: precompile_key(problem, p)), estimates


def closest(estimates: dict[PlanPoint, MemoryEstimate]) -> PlanPoint:
    """The point with the smallest estimate."""
    return min(estimates, key=lambda p: estimates[p].total)


def single_changes(problem: PlanProblem, point: PlanPoint) -> list[tuple[float, str, PlanPoint]]:
    """Single changes of `point` (another remat policy, more micro-batches, a slice twice as large),
    each with its cost and words, those the model and batch allow."""
    base = problem.hardware_flops(point.remat)
    found = []
    for remat in DEFAULT_REMATS:
        if remat != point.remat:
            cost = max(0.0, problem.hardware_flops(remat) / base - 1) if base else 0.0
            found.append((cost, f"remat {remat}", replace(point, remat=remat)))
    for times in (2, 4, 8, 16):
        steps = point.accumulation * times
        if problem.step.global_batch % steps == 0:
            batch = point.per_device_batch(problem.step.global_batch) / times
            words = f"{steps} micro-batches ({batch:g} sequences a device)"
            found.append((MICRO_BATCH_COST * math.log2(times), words, replace(point, accumulation=steps)))
    layout = point.layout
    bigger = replace(problem, topology=problem.topology.as_compiled(2 * layout.devices, int(problem.hbm)))
    larger = replace(point, layout=replace(layout, fsdp=2 * layout.fsdp))
    found.append((LARGER_SLICE_COST, f"a slice of {2 * layout.devices} devices (fsdp {2 * layout.fsdp})", larger))
    return [(cost, words, p) for cost, words, p in found if _valid(bigger if p is larger else problem, p)]


def _valid(problem: PlanProblem, point: PlanPoint) -> bool:
    step = problem.step
    return invalid_reason(point, problem.dims.shape, step.global_batch, step.seq_len, step.flash_block) is None


def fitting_change(
    problem: PlanProblem, point: PlanPoint, same_devices: bool = False
) -> tuple[str, PlanPoint, MemoryEstimate] | None:
    """The smallest single change of `point` estimated to fit, with its words and estimate (None
    if none does). `same_devices` leaves out the larger slice: the change a plan of this
    topology could compile in place of `point` (another remat policy, more micro-batches)."""
    for _, words, changed in sorted(single_changes(problem, point), key=lambda a: a[0]):
        if same_devices and changed.layout.devices != point.layout.devices:
            continue
        changed_estimate = estimate(problem, changed)
        if changed_estimate.fits(problem.hbm):
            return words, changed, changed_estimate
    return None


def what_would_fit(problem: PlanProblem, point: PlanPoint) -> str:
    """One line: `point`'s estimate, and the smallest single change estimated to fit, with its estimate."""
    hbm = problem.hbm
    here = estimate(problem, point)
    head = f"nothing is estimated to fit within {FIT_MARGIN:.0%} of HBM; closest: {point.name()}, {here.text(hbm)}"
    change = fitting_change(problem, point)
    if change is not None:
        words, _, changed_estimate = change
        return f"{head}; {words} would fit ({changed_estimate.text(hbm)})"
    return f"{head}; no single change (remat, micro-batches, a slice twice as large) is estimated to fit"


def widened(
    problem: PlanProblem, points: Sequence[PlanPoint], remats: Sequence[str], accumulations: Sequence[int]
) -> list[PlanPoint]:
    """Every valid point of `points`' layouts under each of `remats` and `accumulations` (the axes
    the user left to the planner), estimated to fit, best-predicted first."""
    layouts = list(dict.fromkeys(p.layout for p in points))
    wider = [
        PlanPoint(layout, remat, steps)
        for layout in layouts
        for remat in remats
        for steps in accumulations
        if problem.step.global_batch % steps == 0
    ]
    return fits_first(problem, [p for p in wider if _valid(problem, p)])[0]


def choose(
    problem: PlanProblem,
    points: Sequence[PlanPoint],
    limit: int,
    emit: Callable[[str], None],
    wider: Callable[[], list[PlanPoint]] | None = None,
    left_out_fate: str = "not compiled",
) -> tuple[list[PlanPoint], list[tuple[PlanPoint, str]]]:
    """(up to `limit` points to compile, fitting ones best-predicted first; the points left out
    with why). With none estimated to fit, the best-predicted of `wider`'s points (other remat
    policies and micro-batches, where the user chose neither: `widened`) estimated to fit are
    compiled instead, said in one line; with none of those either, the line of `what_would_fit`
    goes to `emit` and the closest point is compiled alone. `left_out_fate` ends the line counting
    the points left out (a search may still compile one later: plan_search says so)."""
    if not points:
        return [], []
    fitting, estimates = fits_first(problem, points)
    hbm = problem.hbm
    left_out = [(p, f"{estimates[p].text(hbm)}: above {FIT_MARGIN:.0%} of HBM") for p in points if p not in fitting]
    if fitting:
        if left_out:
            emit(f"{len(left_out)} of {len(points)} points are estimated not to fit in HBM: {left_out_fate}")
        return fitting[:limit], left_out
    nearest = closest(estimates)
    alternatives = wider() if wider is not None else []
    if alternatives:
        emit(
            f"nothing is estimated to fit within {FIT_MARGIN:.0%} of HBM with remat {nearest.remat} and "
            f"{nearest.accumulation} micro-batch{'es' if nearest.accumulation > 1 else ''} (closest "
            f"{nearest.name()}, {estimates[nearest].text(hbm)}); {len(alternatives)} points of other remat "
            "policies or micro-batches are: compiling the best-predicted (give --remat / --accumulation to hold them)"
        )
        return alternatives[:limit], left_out
    emit(what_would_fit(problem, nearest) + "; compiling the closest point anyway")
    return [nearest], [entry for entry in left_out if entry[0] != nearest]


__all__ = [
    "choose",
    "closest",
    "fits_first",
    "fitting_change",
    "layout_preference",
    "outside_the_rows",
    "precompile_key",
    "single_changes",
    "what_would_fit",
    "widened",
]
