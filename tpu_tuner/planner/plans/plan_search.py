"""The planner's search: Optuna over the joint space, one compile a trial.

Each trial picks a tensor, context and data size (fsdp takes the remaining devices), a remat
policy and a micro-batch count (space.py). A point that cannot run (sizes that do not divide)
is told PRUNED as "invalid", one whose HBM lower bound exceeds the device's as "lower_bound",
one already compiled in the study is answered from that trial ("repeat"): none of them compiles
or counts against the budget. The rest compile, `workers` at a time (TPE's constant liar keeps
a batch apart), and are told their predicted tokens/s, with "fits in HBM" as Optuna's constraint
(peak minus HBM, feasible at or below zero) so TPE ranks every fitting point above every other.

The trials live in an Optuna storage (plan_to_folder: $TPU_TUNE_STORAGE, else the results
folder's plans.db), under a study named from the plan's inputs: running the same plan again
resumes it (the budget counts the study's compiles), and workers on other hosts sharing a
PostgreSQL storage compile in parallel; each compiled trial keeps the compiler's figures, so any
worker writes the whole plan. A worker killed mid-compile leaves a trial whose heartbeat stops;
the next worker fails it and queues its point again once (studies/liveness.py). The
ask/tell mechanism (budget, claims, repeats, release, lost trials) is the studies' one loop
(studies/loop.py); this module says what a planner's trial holds and records.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from tpu_tuner.core.credentials import without_password
from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.units import binary_bytes
from tpu_tuner.planner.compiler.compile_pool import CompilePool
from tpu_tuner.planner.compiler.remat import parse_remat
from tpu_tuner.planner.plans.evaluate import evaluate
from tpu_tuner.planner.plans.fits_first import choose
from tpu_tuner.planner.plans.plan_options import PlanOptions
from tpu_tuner.planner.plans.plan_problem import PlanProblem
from tpu_tuner.planner.plans.plan_records import (
    INVALID_VIOLATION,
    params_of,
    plan_of_trial,
    plan_record,
    record_compiled,
    tell_repeat,
    tell_ruled_out,
    trial_summary,
)
from tpu_tuner.planner.plans.plan_result import LayoutPlan, PlanResult, result_of
from tpu_tuner.planner.plans.plan_space import (
    POINT_AXES,
    PlanPoint,
    PlanSpace,
    default_space,
    invalid_reason,
    point_of,
    valid_points,
)
from tpu_tuner.planner.plans.plan_trial import PlanTrial
from tpu_tuner.planner.prediction.hbm_estimate import FIT_MARGIN, estimate, estimate_record
from tpu_tuner.studies import records
from tpu_tuner.studies.fingerprint import differing_keys, digest
from tpu_tuner.studies.liveness import StudyStorage, Worker, open_storage
from tpu_tuner.studies.loop import Claim, Feature, Holding, Rules, Settled, StopReason, run_loop
from tpu_tuner.studies.opening import open_study
from tpu_tuner.studies.records import PlanOutcome
from tpu_tuner.studies.samplers import build_sampler
from tpu_tuner.studies.trial_record import TrialRecord

log = logging.getLogger(__name__)

RECORD_ATTR = "tpu_tune_plan"  # the study's record: what it plans (a joiner must plan the same)
# Asks without a new point to compile before the search stops (the sampler keeps proposing
# points already compiled or ruled out: the space is spent as far as it can tell).
MAX_IDLE_ASKS = 200
# TPE's random trials before it models the results: 4, as the tuner's. Fewer random compiles
# reached the best sooner on every kept search table (docs/planner.md, "The search over slices").
STARTUP_TRIALS = 4


Evaluator = Callable[[PlanProblem, list[PlanPoint], CompilePool, Callable[[str], None]], dict[PlanPoint, LayoutPlan]]


def search(
    problem: PlanProblem,
    options: PlanOptions,
    pool: CompilePool,
    emit: Callable[[str], None],
    started: float,
    evaluator: Evaluator | None = None,
) -> PlanResult:
    """Search the joint space with `options.search.budget` compiles; the result holds every compiled point.

    `evaluator` compiles and predicts a batch of points (default: evaluate.evaluate; the search
    benchmark answers from an exhaustive run's table instead)."""
    shape = problem.dims.shape
    space = options.search.space or default_space(
        problem.topology.devices,
        shape,
        problem.step.seq_len,
        tuple(parse_remat(r).name for r in options.search.remats),
        options.search.accumulations,
        options.search.contexts,
        problem.topology.slices,
        # --flash-block with a search: an axis of one value, so each point is checked against it.
        options.search.flash_blocks or tuple(b for b in (problem.step.flash_block,) if b is not None),
    )
    valid = valid_points(space, problem.topology.devices, shape, problem.step.global_batch, problem.step.seq_len)
    if not valid:
        raise UserInputError(
            f"no point of the space divides this model and batch on {problem.topology.devices} devices"
        )
    grid = options.search.sampler == "grid"
    if grid and not options.search.budget:  # every valid point that may fit
        budget = sum(1 for p in valid if problem.lower_bound(p).total <= problem.hbm)
    else:
        budget = options.search.budget or 0
    study, storage = _open_study(problem, options, space, valid)
    emit(
        f"search: {len(valid)} valid points (tensor {list(space.tensors)}, context {list(space.contexts)}, "
        f"data {list(space.datas)}, {len(space.remats)} remat policies, micro-batches {list(space.accumulations)}); "
        f"{options.search.sampler}, budget {budget} compiles; study {study.study_name!r}"
    )
    allowed: set[str] = set()  # points compiled whatever their estimate (the closest, when none fits)
    if not grid:
        # Memory first (fits_first.py): the first trials are the best-predicted points estimated to
        # fit; with none, the line saying what would fit and the closest point, compiled anyway.
        first, _ = choose(
            problem,
            valid,
            min(STARTUP_TRIALS, budget),
            emit,
            left_out_fate="not among the first trials (compiled if proposed and 90% of the estimate fits)",
        )
        seen = {t.point for t in PlanTrial.all(study.get_trials(deepcopy=False))}
        for point in first:
            if not estimate(problem, point).fits(problem.hbm):
                allowed.add(point.key())
            if point.key() not in seen:
                study.enqueue_trial(params_of(point))
    # A grid: every valid point (plan_sampler), ended once each is settled, compiled
    # or ruled out by the lower bound (`space_size`, as the tuner's grid is); a run of ruled-out
    # points is at most the space long.
    limit = len(valid) if grid and not options.search.budget else budget
    rules = Rules(
        budget=limit,
        batch=pool.workers,
        wait_for_running=False,
        max_idle_asks=len(valid) + MAX_IDLE_ASKS if grid else MAX_IDLE_ASKS,
        space_size=len(valid) if grid else None,
    )
    feature = PlanTrials(
        problem,
        space,
        pool,
        emit,
        started,
        limit,
        evaluator or evaluate,
        Worker.this_process(storage),
        None if grid else allowed,
    )
    end = run_loop(study, feature, rules, feature.worker)
    if end.reason is StopReason.IDLE:
        emit(
            f"search: stopped after {end.idle} proposals in a row that were compiled, invalid or ruled out "
            f"({end.spent} of {limit} compiles): the sampler finds nothing new"
        )
    trials = PlanTrial.all(study.get_trials(deepcopy=False))  # each trial read once for the plan
    compiled = [t for t in trials if t.spends]
    plans = [plan_of_trial(problem, t) for t in compiled]
    for plan in plans:  # a trial keeps the compiler's figures; the estimate is recomputed (cheap)
        plan.memory_estimate = estimate_record(problem, plan.point)
    plans.sort(key=lambda p: (not p.fits, -p.predicted_mfu))
    record = {
        "study": study.study_name,
        "storage": without_password(str(storage.url)) if storage is not None else "memory",
        "sampler": options.search.sampler,
        "seed": options.search.seed,
        "budget": budget,
        "space": space.describe(),
        "valid_points": len(valid),
        "compiled": len(compiled),
        "trials": [trial_summary(t) for t in trials],
    }
    return result_of(problem, plans, [], "searched", started, search=record)


def distributions(space: PlanSpace) -> dict[str, BaseDistribution]:
    """The fixed distributions every trial is asked with (define-and-run, so TPE sees one space)."""
    return {axis: CategoricalDistribution(choices) for axis, choices in space.axes().items()}


def plan_sampler(name: str, seed: int, space: PlanSpace, valid: Sequence[PlanPoint]) -> optuna.samplers.BaseSampler:
    """TPE for a small budget over categorical axes: multivariate (the axes interact: a policy
    that fits at one micro-batch count does not at another), a constant liar for the points
    compiling in parallel, and `STARTUP_TRIALS` random start-up trials; or random search, or
    the grid of every valid point, the tuner's grid sampler (studies/samplers.py).
    Every trial carries its "fits" constraint, which TPE reads."""
    if name == "grid":
        settings = [params_of(point) for point in valid]
        return build_sampler("grid", seed, settings=settings, grid={a: list(c) for a, c in space.axes().items()})
    return build_sampler("tpe" if name == "tpe" else "random", seed, constant_liar=True, startup_trials=STARTUP_TRIALS)


@dataclass(eq=False)  # equal and hashed by identity, as before it was a dataclass
class PlanTrials(Feature):
    """The planner's side of the loop: a trial holds a point, ruled out without a compile when
    it cannot run or cannot fit; claims compile in batches of the pool's workers."""

    problem: PlanProblem
    space: PlanSpace
    pool: CompilePool
    emit: Callable[[str], None]
    started: float
    budget: int
    evaluator: Evaluator
    worker: Worker
    # Keys of points compiled whatever their HBM estimate; None: the estimate rules nothing out
    # (the grid sampler, which compiles every point the lower bound leaves).
    estimate_allows: set[str] | None = None

    def ask(self, study: optuna.Study) -> optuna.Trial:
        return study.ask(distributions(self.space))

    def begin(self, trial: optuna.Trial) -> tuple[Hashable, Any] | None:
        problem, record = self.problem, TrialRecord.of(trial)
        point = point_of(trial.params, problem.topology.devices)
        record.set(records.WORKER, self.worker.id)
        reason = (
            "the sizes leave no whole fsdp size"
            if point is None
            else invalid_reason(point, problem.dims.shape, problem.step.global_batch, problem.step.seq_len)
        )
        if reason or point is None:
            tell_ruled_out(trial, PlanOutcome.INVALID, INVALID_VIOLATION, reason or "")
            return None
        record.set(records.POINT, point.key())
        bound = problem.lower_bound(point)
        if bound.total > problem.hbm:
            tell_ruled_out(
                trial,
                PlanOutcome.LOWER_BOUND,
                (bound.total - problem.hbm) / 2**30,
                f"at least {bound.total / 2**30:.1f} GiB per device (weights and optimizer state "
                f"{bound.weights_and_moments / 2**30:.1f}, accumulated gradients "
                f"{bound.accumulated_gradients / 2**30:.1f}, block inputs {bound.block_inputs / 2**30:.1f}) "
                f"> {problem.hbm / 2**30:.2f} GiB HBM",
            )
            return None
        if self.estimate_allows is not None and point.key() not in self.estimate_allows:
            estimated = estimate(problem, point)
            # Ruled out only beyond the estimate's error: a point estimated just over the limit
            # may fit (the best layouts sit there), and the compiler settles it.
            if estimated.beyond(problem.hbm):
                tell_ruled_out(
                    trial,
                    PlanOutcome.LOWER_BOUND,  # ruled out for HBM before compiling; the reason says by what
                    (FIT_MARGIN * estimated.total - problem.hbm) / 2**30,
                    f"estimated {estimated.total / 2**30:.1f} GiB per device: {FIT_MARGIN:.0%} of it is over "
                    f"{problem.hbm / 2**30:.2f} GiB HBM (memory_estimate.py)",
                )
                return None
        record.write({records.COMPILING: True})  # the claim, in one write
        return point.key(), point

    def key_of(self, trial: FrozenTrial) -> Hashable | None:
        # Another process may read a trial whose parameters are still being written (one by one).
        if not POINT_AXES <= trial.params.keys():
            return None
        point = point_of(trial.params, self.problem.topology.devices)
        return point.key() if point is not None else None

    def setting_written(self, trial: FrozenTrial) -> bool:
        return PlanTrial.of(trial).compiling is not None  # written after the last parameter

    def settled(self, trials: Sequence[FrozenTrial]) -> dict[Hashable, FrozenTrial]:
        # A point ruled out for HBM is settled too (a grid covers it), but spends no compile.
        found: dict[Hashable, FrozenTrial] = {}
        for t in trials:
            record = PlanTrial.of(t)
            if record.spends or record.outcome is PlanOutcome.LOWER_BOUND:
                found.setdefault(record.point, t)
        return found

    def spends(self, trial: FrozenTrial) -> bool:
        return PlanTrial.of(trial).spends

    def holds_claim(self, trial: FrozenTrial) -> Holding:
        # The claim is its `compiling` flag: set at begin, cleared once it is settled without one.
        compiling = PlanTrial.of(trial).compiling
        return Holding.DECIDING if compiling is None else Holding.YES if compiling else Holding.NO

    def tell_settled(self, trial: optuna.Trial, how: Settled, other: FrozenTrial | None) -> None:
        TrialRecord.of(trial).set(records.COMPILING, False)
        if how is Settled.RELEASED or other is None:
            tell_ruled_out(trial, PlanOutcome.RELEASED, 0.0, "the budget was filled by earlier trials")
        elif how is Settled.REPEAT and other.state == TrialState.COMPLETE:
            tell_repeat(trial, PlanTrial.of(other))
        else:  # in flight, or a repeat of a trial not complete yet
            tell_ruled_out(trial, PlanOutcome.REPEAT, 0.0, f"compiling in trial {other.number}")

    def evaluate(self, claims: list[Claim]) -> list[LayoutPlan]:
        results = self.evaluator(self.problem, [c.point for c in claims], self.pool, self.emit)
        return [results[c.point] for c in claims]

    def tell(self, claim: Claim, result: LayoutPlan) -> None:
        try:
            record_compiled(claim.trial, result)
        finally:
            step = result.compiled
            status = (
                f"compiler refused: {step.error}"
                if step.error
                else f"{'fits' if result.fits else 'DOES NOT FIT'}, peak {binary_bytes(step.peak_bytes)}, "
                f"predicted MFU {result.prediction.mfu:.1%}"
                if result.prediction
                else ""
            )
            self.emit(
                f"[{claim.position}/{self.budget}] trial {claim.trial.number}: {claim.point.name()}: "
                f"{status} ({time.perf_counter() - self.started:.0f} s)"
            )


def _open_study(
    problem: PlanProblem, options: PlanOptions, space: PlanSpace, valid: Sequence[PlanPoint]
) -> tuple[optuna.Study, StudyStorage | None]:
    """The plan's study and the storage it was opened with (None: in memory)."""
    record = plan_record(problem, space)
    if options.search.sampler == "grid":
        # A study every point of which is compiled is not another sampler's to resume. The key keeps
        # the sampler's name before issue 58 ("exhaustive"), so such a study's name, a digest, resumes.
        record["exhaustive"] = True
    name = (
        options.store.study or f"plan-{problem.workload}-{problem.topology.jax_name.replace(':', '-')}-{digest(record)}"
    )
    storage = open_storage(options.store.url) if options.store.url else None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    opened = open_study(storage, name, "maximize", RECORD_ATTR, record)
    study, recorded = opened.study, opened.record
    # A fresh plan uses the seed as given (reproducible); a worker joining or resuming a study
    # offsets it by the trials already there, so that two workers do not propose the same points.
    # A grid keeps it: trial n takes the n-th setting of the one order every worker shares.
    offset = 0 if options.search.sampler == "grid" else len(study.get_trials(deepcopy=False))
    study.sampler = plan_sampler(options.search.sampler, options.search.seed + offset, space, valid)
    if not recorded:  # a study of a plan that died before writing it
        study.set_user_attr(RECORD_ATTR, record)
    elif recorded != record:
        differ = ", ".join(differing_keys(recorded, record))
        raise UserInputError(f"study {name!r} plans something else (differs in: {differ}); name another --study")
    return study, storage
