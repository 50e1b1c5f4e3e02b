"""What the verify phase's progress lines say beyond the verdict: a round against the rounds
planned, and why a phase the finish announced did not run (the search's lines: tuning/search/trial_lines.py)."""

from __future__ import annotations

from tpu_tuner.tuning.run.clock import FinishPlan
from tpu_tuner.tuning.verify.race import RACE_WITHIN
from tpu_tuner.tuning.verify.verification import Verification


def round_words(done: int, planned: int) -> str:
    """A verification round against the rounds first planned, which stay the total: "round 5/12",
    then "round 14 (12 planned, 2 added: the interval had not decided, or rounds were disturbed)"."""
    if done <= planned:
        return f"round {done}/{planned}"
    added = done - planned
    return f"round {done} ({planned} planned, {added} added: the interval had not decided, or rounds were disturbed)"


def phases_not_run(plan: FinishPlan, verification: Verification, contenders: int) -> list[str]:
    """Why a phase the finish announced (`plan`) did not run, in words: every announced phase
    either runs or is said not to have (issue 55: a race and 12 rounds announced, neither run,
    nothing said). `contenders`: the search's leaders within reach of the best."""
    said = []
    if verification.speedup is None:
        said.append(f"no race and no verification rounds: {verification.message}")
        return said
    if plan.race_top > 1 and not verification.race:
        said.append(
            f"no race: only {contenders} setting(s) came within {RACE_WITHIN:.2f}x of the best in the search, "
            "so one measurement each could not have put them in another order"
            if contenders <= 1
            else "no race: racing the leaders failed, so the search's best was verified (workers.log says why)"
        )
    return said


__all__ = ["phases_not_run", "round_words"]
