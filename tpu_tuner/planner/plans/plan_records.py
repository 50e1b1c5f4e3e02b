"""What a plan records in its Optuna study (`plan_record`, what every trial depends on) and a
planner trial in its own record, and how a settled trial is read back: the
outcome and reason of a point told without a compile, the compiler's figures of a compiled one,
the HBM constraint TPE ranks by, and a trial's summary in the plan (planner/plans/plan_search.py asks).

The keys go into the trial's record (studies/trial_record.py, as the tuner's): written once when
the trial claims a compile and once when it is told; `records.attrs` reads a study of any version
(planner studies before issue 37 hold each key as its own attribute)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import optuna
from optuna.trial import TrialState

from tpu_tuner.planner.compiler.compiled_step import CompiledStep
from tpu_tuner.planner.plans.evaluate import judged
from tpu_tuner.planner.plans.plan_problem import PlanProblem
from tpu_tuner.planner.plans.plan_result import LayoutPlan
from tpu_tuner.planner.plans.plan_space import PlanPoint, PlanSpace, point_of
from tpu_tuner.planner.plans.plan_trial import PlanTrial
from tpu_tuner.studies import records
from tpu_tuner.studies.fingerprint import file_sha256
from tpu_tuner.studies.records import PlanOutcome
from tpu_tuner.studies.trial_record import TrialRecord

CONSTRAINT = "hbm_over_gib"  # the trial constraint: how far past the device's HBM (<= 0: fits)
# The constraint of a point the compiler refused (its peak unknown: out of memory, mostly) and of
# one that cannot exist (sizes that do not divide), in GiB past the HBM.
REFUSED_VIOLATION = 1.0
INVALID_VIOLATION = 1000.0


def plan_record(problem: PlanProblem, space: PlanSpace) -> dict[str, Any]:
    """What a plan's trials depend on: another plan with the same record may reuse them. The step's
    part is the compile request's (StepSettings.record): a new option is recorded with no line here."""
    return {
        "model_sha256": problem.model_digest or file_sha256(problem.source),
        "preset": problem.preset,
        "topology": problem.topology.jax_name,
        "devices": problem.topology.devices,
        "fast": problem.fast,
        **problem.step.record(),
        # The blocks the planner chose (a chip's timings) change every compile: present only where
        # chosen, so a study planned without a choice keeps its record.
        **({"chosen_flash_block": problem.chosen_flash_block} if problem.chosen_flash_block is not None else {}),
        "space": space.describe(),
    }


def set_constraint(trial: optuna.Trial, gib_over: float) -> None:
    """Peak HBM minus the device's, in GiB: feasible at or below zero (kept in the record too,
    stored at its next write)."""
    trial.set_constraint(CONSTRAINT, gib_over)
    TrialRecord.of(trial).set(records.CONSTRAINT_VALUE, gib_over)


def params_of(point: PlanPoint) -> dict[str, Any]:
    """The trial parameters that ask for `point` (the search's distributions)."""
    return {
        "tensor": point.layout.tensor,
        "context": point.layout.context,
        "data": point.layout.data,
        "remat": point.remat,
        "accumulation": point.accumulation,
        **({"dcn": f"{point.layout.dcn_data}x{point.layout.dcn_fsdp}"} if point.layout.slices > 1 else {}),
    }


def tell_ruled_out(trial: optuna.Trial, outcome: PlanOutcome, gib_over: float, reason: str) -> None:
    """Told without a compile: PRUNED, infeasible by `gib_over` (TPE keeps away from such points)."""
    set_constraint(trial, gib_over)
    TrialRecord.of(trial).write({records.OUTCOME: outcome, records.REASON: reason})
    trial.study.tell(trial, state=TrialState.PRUNED)


def tell_repeat(trial: optuna.Trial, earlier: PlanTrial) -> None:
    """Told the value and constraint of the `earlier` trial that compiled the same point."""
    set_constraint(trial, earlier.constraint if earlier.constraint is not None else REFUSED_VIOLATION)
    TrialRecord.of(trial).write(
        {records.OUTCOME: PlanOutcome.REPEAT, records.REASON: f"compiled in trial {earlier.number}"}
    )
    trial.study.tell(trial, earlier.value if earlier.value is not None else 0.0)


def record_compiled(trial: optuna.Trial, plan: LayoutPlan) -> None:
    """Keep a compile's figures on its trial and tell the predicted tokens/s (0: refused)."""
    step = plan.compiled
    set_constraint(trial, REFUSED_VIOLATION if step.error else -plan.margin_bytes / 2**30)
    TrialRecord.of(trial).write(
        {
            records.OUTCOME: PlanOutcome.REFUSED if step.error else PlanOutcome.COMPILED,
            records.COMPILED_STEP: compiled_to_dict(step),
            records.FIT_EFFORT: plan.fit_effort,  # which compile decided "fits" (evaluate.near_limit)
            records.COMPILING: False,
        }
    )
    trial.study.tell(trial, plan.prediction.tokens_per_second if plan.prediction else 0.0, skip_if_finished=True)


def compiled_to_dict(step: CompiledStep) -> dict[str, Any]:
    """The whole-step figures a trial keeps (the loop measurement is already folded in)."""
    data = asdict(step)
    data.pop("loop_iteration", None)
    return data


def plan_of_trial(problem: PlanProblem, trial: PlanTrial) -> LayoutPlan:
    """A compiled trial's LayoutPlan, predicted anew with this plan's cost model."""
    point = point_of(trial.params, problem.topology.devices)
    assert point is not None  # a settled trial's parameters were valid: it was not ruled out
    assert trial.compiled is not None  # a compiled (or refused) trial keeps the compiler's figures
    plan = judged(problem, point, trial.compiled)
    plan.fit_effort = trial.fit_effort or ("fast" if problem.fast else "full")
    return plan


def trial_summary(trial: PlanTrial) -> dict[str, Any]:
    """A trial as the plan's JSON lists it."""
    return {
        "number": trial.number,
        "state": trial.state.name,
        "outcome": trial.outcome,
        "point": trial.point,
        "params": trial.params,
        "reason": trial.reason,
        "tokens_per_second": trial.value if trial.state == TrialState.COMPLETE else None,
        "worker": trial.worker,
    }
