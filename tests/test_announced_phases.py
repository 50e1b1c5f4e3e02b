"""Issue 55, item 5: every phase the finish announces either runs or is said not to have. A run
printed "race of 5 leaders (6 rounds), 12 verification rounds: about 29.6 s", then neither ran,
with 103 s of clock left, and nothing said why."""

from __future__ import annotations

from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.metrics.paired import paired_speedup
from tpu_tuner.tuning.run.clock import FinishPlan
from tpu_tuner.tuning.verify.verification import Verification
from tpu_tuner.tuning.verify.verify_lines import phases_not_run

PLAN = FinishPlan(race_top=5, race_rounds=6, verify_rounds=12, ablations=True, seconds=29.6)


def _verified(race: list) -> Verification:
    speedup = paired_speedup([0.1] * 12, [0.05, 0.051] * 6)
    return Verification(0, 1, Candidate(matmul_precision="medium"), True, speedup, race=race, message="verified")


def test_a_verification_that_compared_nothing_says_why_neither_ran() -> None:
    kept = Verification.keeping_baseline(Candidate(), "no gain: no feasible candidate beat the baseline")
    (said,) = phases_not_run(PLAN, kept, contenders=0)
    assert said == "no race and no verification rounds: no gain: no feasible candidate beat the baseline"


def test_an_announced_race_that_did_not_run_is_said_with_its_cause() -> None:
    (alone,) = phases_not_run(PLAN, _verified([]), contenders=1)
    assert alone.startswith("no race: only 1 setting(s) came within 1.15x of the best")
    (failed,) = phases_not_run(PLAN, _verified([]), contenders=3)
    assert failed.startswith("no race: racing the leaders failed")


def test_phases_that_ran_or_were_not_announced_need_no_word() -> None:
    assert phases_not_run(PLAN, _verified(["an entry"]), contenders=3) == []
    no_race = FinishPlan(race_top=0, race_rounds=0, verify_rounds=6, ablations=False, seconds=10.0)
    assert phases_not_run(no_race, _verified([]), contenders=1) == []


def test_the_round_total_is_the_first_plan_and_the_rounds_beyond_it_are_said() -> None:
    """Issue 55: the total moved ("round 3/12", "4/13", "6/12", "13/18")."""
    from tpu_tuner.tuning.verify.verify_lines import round_words

    assert round_words(5, 12) == "round 5/12"
    assert round_words(14, 12).startswith("round 14 (12 planned, 2 added: the interval had not decided")
