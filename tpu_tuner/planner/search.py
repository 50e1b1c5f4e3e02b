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
the next worker fails it and queues its point again once (tuning/liveness.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from tpu_tuner.core.credentials import without_password
from tpu_tuner.core.errors import UserInputError
from tpu_tuner.planner.collectives import Collective
from tpu_tuner.planner.program import CompiledStep
from tpu_tuner.planner.remat import parse_remat
from tpu_tuner.planner.space import PlanPoint, SearchSpace, default_space, invalid_reason, point_of, valid_points
from tpu_tuner.core.units import binary_bytes

if TYPE_CHECKING:
    from tpu_tuner.planner.compile_pool import CompilePool
    from tpu_tuner.planner.plan import LayoutPlan, PlanOptions, PlanProblem, PlanResult

log = logging.getLogger(__name__)

SAMPLERS = ("tpe", "random", "exhaustive")
CONSTRAINT = "hbm_over_gib"  # the trial constraint: how far past the device's HBM (<= 0: fits)
RECORD_ATTR = "tpu_tune_plan"  # the study's record: what it plans (a joiner must plan the same)
# Outcomes of a trial (its "outcome" attribute); only the first two compiled.
COMPILED, REFUSED, INVALID, LOWER_BOUND, REPEAT = "compiled", "refused", "invalid", "lower_bound", "repeat"
RELEASED = "released"  # asked when other workers' compiles had filled the budget
# The constraint of a point the compiler refused (its peak unknown: out of memory, mostly) and of
# one that cannot exist (sizes that do not divide), in GiB past the HBM.
REFUSED_VIOLATION = 1.0
INVALID_VIOLATION = 1000.0
# Asks without a new point to compile before the search stops (the sampler keeps proposing
# points already compiled or ruled out: the space is spent as far as it can tell).
MAX_IDLE_ASKS = 200


Evaluator = Callable[["PlanProblem", list[PlanPoint], "CompilePool", Callable[[str], None]], dict[PlanPoint, "LayoutPlan"]]


def search(problem: PlanProblem, options: PlanOptions, pool: CompilePool, emit: Callable[[str], None],
           started: float, evaluator: Evaluator | None = None) -> PlanResult:
    """Search the joint space with `options.budget` compiles; the result holds every compiled point.

    `evaluator` compiles and predicts a batch of points (default: plan.evaluate; the search
    benchmark answers from an exhaustive run's table instead)."""
    from tpu_tuner.planner.plan import result_of

    if options.sampler not in SAMPLERS:
        raise UserInputError(f"unknown plan sampler {options.sampler!r} (known: {', '.join(SAMPLERS)})")
    if options.budget is not None and options.budget < 1 and options.sampler != "exhaustive":
        raise UserInputError(f"--budget must be at least 1, not {options.budget}")
    shape = problem.dims.shape
    space = options.space or default_space(problem.topology.devices, shape, problem.seq_len,
                                           tuple(parse_remat(r).name for r in options.remats),
                                           options.accumulations, options.contexts)
    valid = valid_points(space, problem.topology.devices, shape, problem.global_batch, problem.seq_len)
    if not valid:
        raise UserInputError(f"no point of the space divides this model and batch on {problem.topology.devices} devices")
    exhaustive = options.sampler == "exhaustive"
    if exhaustive and not options.budget:  # every valid point that may fit
        budget = sum(1 for p in valid if problem.lower_bound(p).total <= problem.hbm)
    else:
        budget = options.budget or 0
    study, storage = _open_study(problem, options, space)
    emit(f"search: {len(valid)} valid points (tensor {list(space.tensors)}, context {list(space.contexts)}, "
         f"data {list(space.datas)}, {len(space.remats)} remat policies, micro-batches {list(space.accumulations)}); "
         f"{options.sampler}, budget {budget} compiles; study {study.study_name!r}")
    if exhaustive:
        # Every point not settled (compiled, refused, ruled out) or queued already; a released or
        # lost trial's point is queued again.
        settled = (COMPILED, REFUSED, INVALID, LOWER_BOUND)
        done = {_params_key(t.params) for t in study.get_trials(deepcopy=False)
                if t.user_attrs.get("outcome") in settled or t.state == TrialState.WAITING}
        for point in valid:
            if _params_key(_params(point)) not in done:
                study.enqueue_trial(_params(point))
    # Exhaustive without a budget ends when the queue does (points ruled out before compiling included).
    _run(study, storage, problem, space, len(valid) if exhaustive and not options.budget else budget, pool, emit,
         started, queue_only=exhaustive, evaluator=evaluator)
    trials = study.get_trials(deepcopy=False)
    plans = [_plan_of(problem, t) for t in trials if t.user_attrs.get("outcome") in (COMPILED, REFUSED)]
    plans.sort(key=lambda p: (not p.fits, -(p.prediction.mfu if p.prediction else 0.0)))
    record = {
        "study": study.study_name,
        "storage": without_password(str(storage.url)) if storage is not None and hasattr(storage, "url") else "memory",
        "sampler": options.sampler, "seed": options.seed, "budget": budget, "space": space.describe(),
        "valid_points": len(valid),
        "compiled": sum(1 for t in trials if t.user_attrs.get("outcome") in (COMPILED, REFUSED)),
        "trials": [_trial_summary(t) for t in trials],
    }
    return result_of(problem, plans, [], "searched", started, search=record)


def count_compiles(trials: list[FrozenTrial]) -> int:
    """Compiles the study has made or is making (the budget's count)."""
    return sum(1 for t in trials if t.user_attrs.get("outcome") in (COMPILED, REFUSED)
               or (t.state == TrialState.RUNNING and t.user_attrs.get("compiling")))


def distributions(space: SearchSpace) -> dict[str, CategoricalDistribution]:
    """The fixed distributions every trial is asked with (define-and-run, so TPE sees one space)."""
    return {"tensor": CategoricalDistribution(space.tensors), "context": CategoricalDistribution(space.contexts),
            "data": CategoricalDistribution(space.datas), "remat": CategoricalDistribution(space.remats),
            "accumulation": CategoricalDistribution(space.accumulations)}


def build_sampler(name: str, seed: int, budget: int) -> optuna.samplers.BaseSampler:
    """TPE for a small budget over categorical axes: multivariate (the axes interact: a policy
    that fits at one micro-batch count does not at another), a constant liar for the points
    compiling in parallel, and few random start-up trials; or random search, or (exhaustive)
    the queue of every point."""
    if name == "tpe":
        # Every trial carries its "fits" constraint (Trial.set_constraint), which TPE reads.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(
                seed=seed, multivariate=True, constant_liar=True, n_startup_trials=max(4, min(10, budget // 4)))
    return optuna.samplers.RandomSampler(seed=seed)


def _set_constraint(trial: optuna.Trial, gib_over: float) -> None:
    """Peak HBM minus the device's, in GiB: feasible at or below zero."""
    trial.set_constraint(CONSTRAINT, gib_over)
    trial.set_user_attr("constraint", gib_over)


def _params_key(params: dict[str, Any]) -> tuple:
    return tuple(sorted(params.items()))


def _params(point: PlanPoint) -> dict[str, Any]:
    return {"tensor": point.layout.tensor, "context": point.layout.context, "data": point.layout.data,
            "remat": point.remat, "accumulation": point.accumulation}


def fingerprint(problem: PlanProblem, space: SearchSpace) -> dict[str, Any]:
    """What a plan's trials depend on: another plan with the same fingerprint may reuse them."""
    from tpu_tuner.studies.fingerprint import file_sha256

    return {"model_sha256": file_sha256(problem.source), "preset": problem.preset,
            "topology": problem.topology.jax_name, "devices": problem.topology.devices,
            "global_batch": problem.global_batch, "seq_len": problem.seq_len, "fast": problem.fast,
            "first_moment_dtype": problem.first_moment_dtype,
            "space": space.describe()}


def _open_study(problem: PlanProblem, options: PlanOptions,
                space: SearchSpace) -> tuple[optuna.Study, optuna.storages.RDBStorage | None]:
    record = fingerprint(problem, space)
    if options.sampler == "exhaustive":
        # Its queue of every point must not become another sampler's first proposals.
        record["exhaustive"] = True
    digest = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:10]
    name = options.study or f"plan-{problem.workload}-{problem.topology.jax_name.replace(':', '-')}-{digest}"
    storage = None
    if options.storage:
        from tpu_tuner.studies.liveness import open_storage

        storage = open_storage(options.storage)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True)
    # A fresh plan uses the seed as given (reproducible); a worker joining or resuming a study
    # offsets it by the trials already there, so that two workers do not propose the same points.
    study.sampler = build_sampler(options.sampler, options.seed + len(study.get_trials(deepcopy=False)),
                                  options.budget or 0)
    recorded = study.user_attrs.get(RECORD_ATTR)
    if recorded is None:
        study.set_user_attr(RECORD_ATTR, record)
    elif recorded != record:
        differ = ", ".join(k for k in record if record[k] != recorded.get(k))
        raise UserInputError(f"study {name!r} plans something else (differs in: {differ}); name another --study")
    return study, storage


def _run(study: optuna.Study, storage: optuna.storages.RDBStorage | None, problem: PlanProblem, space: SearchSpace,
         budget: int, pool: CompilePool, emit: Callable[[str], None], started: float, queue_only: bool = False,
         evaluator: Evaluator | None = None) -> None:
    """Compile `budget` points, `pool.workers` at a time; `queue_only`: only the queued ones."""
    from tpu_tuner.planner.plan import evaluate
    from tpu_tuner.studies.liveness import Heartbeat, Worker, fail_lost_trials

    shape = problem.dims.shape
    worker = Worker.this_process(storage)
    idle = 0
    while True:
        if storage is not None:
            # Every trial beats from its ask on, so a stale heartbeat is the one sign of a lost
            # worker (no overdue clock: a batch of large compiles may run for hours).
            fail_lost_trials(study, storage)
        trials = study.get_trials(deepcopy=False)
        compiled = count_compiles(trials)
        if compiled >= budget:
            return
        if idle >= MAX_IDLE_ASKS and not queue_only:
            emit(f"search: stopped after {idle} proposals in a row that were compiled, invalid or ruled out "
                 f"({compiled} of {budget} compiles): the sampler finds nothing new")
            return
        batch: list[tuple[optuna.Trial, PlanPoint]] = []
        while len(batch) < min(pool.workers, budget - compiled) and (queue_only or idle < MAX_IDLE_ASKS):
            if queue_only and not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                break
            with warnings.catch_warnings():
                # Optuna warns that heartbeats are meant for `optimize`; this loop beats itself.
                warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
                trial = study.ask(distributions(space))
            if storage is not None:  # one beat now, so a worker that dies before compiling is seen stale
                storage.record_heartbeat(trial._trial_id)  # noqa: SLF001
            point = point_of(trial.params, problem.topology.devices)
            trial.set_user_attr("worker", worker.id)
            reason = "the sizes leave no whole fsdp size" if point is None else invalid_reason(
                point, shape, problem.global_batch, problem.seq_len)
            if reason or point is None:
                _tell_ruled_out(study, trial, INVALID, INVALID_VIOLATION, reason or "")
                idle += 1
                continue
            trial.set_user_attr("point", point.key())
            bound = problem.lower_bound(point)
            if bound.total > problem.hbm:
                _tell_ruled_out(study, trial, LOWER_BOUND, (bound.total - problem.hbm) / 2**30,
                                f"at least {bound.total / 2**30:.1f} GiB per device (weights and moments "
                                f"{bound.weights_and_moments / 2**30:.1f}, accumulated gradients "
                                f"{bound.accumulated_gradients / 2**30:.1f}, block inputs {bound.block_inputs / 2**30:.1f}) "
                                f"> {problem.hbm / 2**30:.2f} GiB HBM")
                idle += 1
                continue
            trial.set_user_attr("compiling", True)
            # Claims are settled by trial number (other workers, and this batch, ask too). A point an
            # earlier trial compiles or has compiled is a repeat, answered from it once finished;
            # past the budget, counting every earlier claim (an earlier trial still deciding counts
            # as one), this trial is released without compiling.
            claims = [t for t in study.get_trials(deepcopy=False) if t.number <= trial.number and (
                t.user_attrs.get("outcome") in (COMPILED, REFUSED)
                or (t.state == TrialState.RUNNING and t.user_attrs.get("compiling", True)))]
            first = next((t for t in claims if t.user_attrs.get("point") == point.key()), None)
            if first is not None and first.number != trial.number:
                trial.set_user_attr("compiling", False)
                if first.state == TrialState.COMPLETE:
                    _tell_repeat(study, trial, first)
                else:
                    _tell_ruled_out(study, trial, REPEAT, 0.0, f"compiling in trial {first.number}")
                idle += 1
                continue
            if len(claims) > budget:
                trial.set_user_attr("compiling", False)
                _tell_ruled_out(study, trial, RELEASED, 0.0, "the budget was filled by earlier trials")
                idle += 1
                time.sleep(worker.poll_s)  # the earlier trials settle (compile, or turn out not to)
                break
            batch.append((trial, point))
            idle = 0
        if not batch:
            if queue_only:
                return
            continue
        beats = [Heartbeat(storage, t._trial_id) for t, _ in batch] if storage is not None else []  # noqa: SLF001
        for beat in beats:
            beat.__enter__()
        try:
            results = (evaluator or evaluate)(problem, [p for _, p in batch], pool, emit)
        finally:
            for beat in beats:
                beat.__exit__(None, None, None)
        for index, (trial, point) in enumerate(batch, 1):
            plan = results[point]
            _tell_compiled(study, trial, plan)
            status = (f"compiler refused: {plan.compiled.error}" if plan.compiled.error else
                      f"{'fits' if plan.fits else 'DOES NOT FIT'}, peak {binary_bytes(plan.compiled.peak_bytes)}, "
                      f"predicted MFU {plan.prediction.mfu:.1%}" if plan.prediction else "")
            emit(f"[{compiled + index}/{budget}] trial {trial.number}: {point.name()}: "
                 f"{status} ({time.perf_counter() - started:.0f} s)")


def _tell_ruled_out(study: optuna.Study, trial: optuna.Trial, outcome: str, gib_over: float, reason: str) -> None:
    """Told without a compile: PRUNED, infeasible by `gib_over` (TPE keeps away from such points)."""
    trial.set_user_attr("outcome", outcome)
    trial.set_user_attr("reason", reason)
    _set_constraint(trial, gib_over)
    study.tell(trial, state=TrialState.PRUNED)


def _tell_repeat(study: optuna.Study, trial: optuna.Trial, earlier: FrozenTrial) -> None:
    trial.set_user_attr("outcome", REPEAT)
    trial.set_user_attr("reason", f"compiled in trial {earlier.number}")
    _set_constraint(trial, earlier.user_attrs.get("constraint", REFUSED_VIOLATION))
    study.tell(trial, earlier.value if earlier.value is not None else 0.0)


def _tell_compiled(study: optuna.Study, trial: optuna.Trial, plan: LayoutPlan) -> None:
    try:
        _record_compiled(study, trial, plan)
    except optuna.exceptions.UpdateFinishedTrialError:
        # Failed as lost meanwhile (its heartbeat went stale: a suspended process); its point is
        # queued again, and this compile's result is not recorded twice.
        log.warning("trial %d was failed as lost while it compiled; its result is dropped", trial.number)


def _record_compiled(study: optuna.Study, trial: optuna.Trial, plan: LayoutPlan) -> None:
    step = plan.compiled
    trial.set_user_attr("outcome", REFUSED if step.error else COMPILED)
    trial.set_user_attr("compiled", compiled_to_dict(step))
    _set_constraint(trial, REFUSED_VIOLATION if step.error else -plan.margin_bytes / 2**30)
    trial.set_user_attr("compiling", False)
    study.tell(trial, plan.prediction.tokens_per_second if plan.prediction else 0.0, skip_if_finished=True)


def compiled_to_dict(step: CompiledStep) -> dict[str, Any]:
    """The whole-step figures a trial keeps (the loop measurement is already folded in)."""
    data = asdict(step)
    data.pop("loop_iteration", None)
    return data


def compiled_from_dict(data: dict[str, Any]) -> CompiledStep:
    fields = dict(data)
    fields["collectives"] = [Collective(**c) for c in fields.get("collectives", [])]
    return CompiledStep(**fields)


def _point_of_trial(trial: FrozenTrial, devices: int) -> PlanPoint:
    point = point_of(trial.params, devices)
    assert point is not None
    return point


def _plan_of(problem: PlanProblem, trial: FrozenTrial) -> LayoutPlan:
    """A compiled trial's LayoutPlan, predicted anew with this plan's cost model."""
    from tpu_tuner.planner.plan import judged

    return judged(problem, _point_of_trial(trial, problem.topology.devices), compiled_from_dict(trial.user_attrs["compiled"]))


def _trial_summary(trial: FrozenTrial) -> dict[str, Any]:
    attrs = trial.user_attrs
    return {"number": trial.number, "state": trial.state.name, "outcome": attrs.get("outcome"),
            "point": attrs.get("point"), "params": trial.params, "reason": attrs.get("reason"),
            "tokens_per_second": trial.value if trial.state == TrialState.COMPLETE else None,
            "worker": attrs.get("worker")}
