"""The words of a search's progress lines: a trial's figures, its objective's name, its suspects."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tpu_tuner.core.units import duration
from tpu_tuner.metrics.mfu import mfu_text
from tpu_tuner.studies.attribution import Suspect
from tpu_tuner.tuning.search.bucketing_context import BucketingContext
from tpu_tuner.tuning.search.failure_learning import label


def suspected_words(suspects: Sequence[Suspect]) -> str:
    """Open suspects in words: "autocast bfloat16 failed in trial 2 (crash) and never worked"."""
    parts = []
    for suspect in suspects:
        names = " with ".join(label(name, value) for name, value in suspect.values)
        trials = ", ".join(str(n) for n in suspect.failures)
        parts.append(f"{names} failed in trial {trials} ({suspect.kind}) and never worked")
    return "; ".join(parts)


def objective_name(bucketing: BucketingContext | None) -> str:
    """What a trial's objective is, as progress lines name it."""
    return "expected (bucketed)" if bucketing is not None else "amortised"


def trial_figures(objective: float, m: Any, planned_steps: int, bucketing: BucketingContext | None) -> str:
    """A trial's figures, leading with its objective (what "best" shows) and how it is made up:
    "470 ms amortised (step 465 ms + compile 25.0 s / 5000 steps), MFU 37.4%"."""
    if bucketing is not None:
        parts = f"step {duration(m.step_median)} at the reference length, compile {duration(m.compile_seconds)} a shape"
    else:
        parts = f"step {duration(m.step_median)} + compile {duration(m.compile_seconds)} / {planned_steps} steps"
    return f"{duration(objective)} {objective_name(bucketing)} ({parts}), MFU {mfu_text(m.mfu)}"


__all__ = ["objective_name", "suspected_words", "trial_figures"]
