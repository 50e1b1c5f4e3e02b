"""A planner trial read once: its stored record (studies/records.py) as a frozen, typed value.

`PlanTrial.of` is the one place a planner trial's keys are read (a study of any version, through
the study layer's record, studies/study_trial.py; planner studies before issue 37 hold each key as
its own attribute): the loop's hooks, the plan's compiled trials and its summary take the record
instead of the dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

from optuna.trial import FrozenTrial

from tpu_tuner.planner.compiler.compiled_step import CompiledStep
from tpu_tuner.planner.prediction.collectives import Collective
from tpu_tuner.studies import records
from tpu_tuner.studies.records import PlanOutcome
from tpu_tuner.studies.study_trial import StudyTrial


@dataclass(frozen=True)
class PlanTrial(StudyTrial):
    """One planner trial as its record says: the study layer's record, then what became of it, the
    point it holds, its claim on a compile and the compiler's figures."""

    outcome: PlanOutcome | None  # None: not settled yet
    reason: str | None  # why it was told without a compile
    point: str | None  # the point's key
    compiling: bool | None  # its claim on a compile of the budget (None: not decided yet)
    compiled: CompiledStep | None  # the compiler's figures (refused: with its error)
    fit_effort: str | None  # which compile decided "fits" (None: written before it was recorded)
    constraint: float | None  # its HBM constraint, GiB past the device's

    @classmethod
    def of(cls, trial: FrozenTrial) -> Self:
        """The record of `trial`, from a study of any version."""
        study = StudyTrial.of(trial)  # the record as stored (any layout), read once by the study layer
        a = study.stored
        outcome, compiled = a.get(records.OUTCOME), a.get(records.COMPILED_STEP)
        constraint = a.get(records.CONSTRAINT_VALUE)
        return cls(
            **vars(study),
            outcome=None if outcome is None else PlanOutcome(outcome),
            reason=a.get(records.REASON),
            point=a.get(records.POINT),
            compiling=a.get(records.COMPILING),
            compiled=compiled_from_dict(compiled) if isinstance(compiled, dict) else None,
            fit_effort=a.get(records.FIT_EFFORT),
            constraint=None if constraint is None else float(constraint),
        )

    @property
    def worker(self) -> str | None:
        """The worker that claimed it (`claims.worker`)."""
        return self.claims.worker

    @property
    def spends(self) -> bool:
        """Whether it holds a compile of the budget (compiled, or refused by the compiler)."""
        return self.outcome in (PlanOutcome.COMPILED, PlanOutcome.REFUSED)


def compiled_from_dict(data: dict[str, Any]) -> CompiledStep:
    """The compiler's figures a trial keeps (plan_records.compiled_to_dict), read back."""
    fields = dict(data)
    fields["collectives"] = [Collective(**c) for c in fields.get("collectives", [])]
    return CompiledStep(**fields)


__all__ = ["PlanTrial", "compiled_from_dict"]
