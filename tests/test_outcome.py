"""Issue 55, items 4 and 9: one trial numbering and one vocabulary. A run's terminal said "trial
17/48", report.md "29 trials", the dashboard 17; the report said PRUNED for stopped and failed
trials alike; never-run trials were listed as WAITING rows of nan. Each trial now has one outcome
(studies/outcome.py) in trials.csv, report.md and the dashboard, and never-run ones are no rows."""

from __future__ import annotations

import optuna

from tpu_tuner.studies import records
from tpu_tuner.studies.outcome import Outcome, outcome_of, tally
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.search.trials_table import trials_frame


def test_each_record_reads_as_one_outcome() -> None:
    cases = {
        ("COMPLETE", ()): Outcome.MEASURED,
        ("COMPLETE", ((records.FAILURE_KIND, "accuracy"),)): Outcome.MEASURED,  # infeasible, still measured
        ("PRUNED", ((records.STOPPED_EARLY, "too slow"),)): Outcome.STOPPED_EARLY,
        ("PRUNED", ((records.FAILURE_KIND, "crash"),)): Outcome.FAILED,
        ("PRUNED", ((records.REJECTED_BY, "clock: ..."),)): Outcome.REJECTED,
        ("PRUNED", ((records.FAILURE_KIND, "would-not-fit"),)): Outcome.REJECTED,
        ("PRUNED", ((records.EXCLUDED_BY, "autocast=bfloat16"),)): Outcome.EXCLUDED,
        ("COMPLETE", ((records.REPEAT_OF, 3),)): Outcome.REPEAT,
        ("PRUNED", ((records.OVER_BUDGET, True),)): Outcome.RELEASED,
        ("FAIL", ((records.FAILURE_KIND, "interrupted"),)): Outcome.INTERRUPTED,
        ("WAITING", ()): Outcome.NEVER_RUN,
        ("RUNNING", ()): Outcome.RUNNING,
        ("FAIL", ()): Outcome.INTERRUPTED,  # a lost worker's trial: no kind recorded
        ("PRUNED", ((records.FAILURE_KIND, "aborted"),)): Outcome.FAILED,  # a kind of another runner
    }
    for (state, attrs), outcome in cases.items():
        assert outcome_of(state, dict(attrs)) is outcome, (state, attrs)


def test_a_tally_counts_in_the_same_words() -> None:
    outcomes = [Outcome.MEASURED] * 12 + [Outcome.STOPPED_EARLY] * 5 + [Outcome.REJECTED] * 9 + [Outcome.REPEAT] * 3
    assert tally(outcomes) == "29 trials: 17 measured (5 stopped early), 9 rejected unmeasured, 3 repeats"
    assert tally([Outcome.MEASURED, Outcome.REPEAT]) == "2 trials: 1 measured, 1 repeat"


def test_trials_csv_has_the_outcome_and_no_never_run_rows() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = SearchSpace.load("precision", "cpu")
    study = optuna.create_study()
    trial = study.ask()
    space.suggest(trial)
    trial.set_user_attr(records.STOPPED_EARLY, "too slow")
    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    study.enqueue_trial(space.baseline_params())  # queued, never asked: a WAITING trial
    frame = trials_frame(study, space, lambda m: m)
    assert list(frame["number"]) == [0] and list(frame["outcome"]) == ["stopped early"]
    assert len(study.trials) == 2 and study.trials[1].state.name == "WAITING"
