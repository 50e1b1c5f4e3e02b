"""The seeds' winners stacked (tpu_tuner/tuning/search/stacking.py): once the combined seed and its
one-agent variants have finished, the variants that beat it are merged into one more setting."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from tpu_tuner.studies import records
from tpu_tuner.tuning.search.search_space import Param, SearchSpace
from tpu_tuner.tuning.search.stacking import record_plan, stacked_setting
from tpu_tuner.tuning.search.tuning_trial import TuningTrial

SPACE = SearchSpace(
    "test",
    "cpu",
    (
        Param("execution", "compile", ("eager", "inductor"), ""),
        Param("autocast", "precision", ("none", "bfloat16"), ""),
        Param("compile_scope", "compile", ("model", "model+loss"), ""),
        Param("optimizer_impl", "compile", ("default", "fused"), ""),
        Param("micro_batches", "memory", ("1", "2"), ""),
    ),
)
COMBINED = SPACE.complete({"execution": "inductor", "autocast": "bfloat16"})
LOSS = {**COMBINED, "compile_scope": "model+loss"}
FUSED = {**COMBINED, "optimizer_impl": "fused"}
SPLIT = {**COMBINED, "micro_batches": "2"}


def _study(results: list[tuple[dict[str, str], float | None]]) -> optuna.Study:
    study = optuna.create_study()
    record_plan(study, COMBINED, [LOSS, FUSED, SPLIT])
    for params, value in results:
        choices = {p.name: p.choices for p in SPACE.params}
        distributions = {name: CategoricalDistribution(choices[name]) for name in params}
        if value is None:  # failed, or over the accuracy tolerance
            trial = optuna.trial.create_trial(params=params, distributions=distributions, state=TrialState.PRUNED)
        else:
            trial = optuna.trial.create_trial(
                params=params, distributions=distributions, value=value, user_attrs={records.FEASIBLE: True}
            )
        study.add_trial(trial)
    return study


def _stacked(results: list[tuple[dict[str, str], float | None]]) -> dict[str, str] | None:
    study = _study(results)
    return stacked_setting(study, TuningTrial.all(study.get_trials(deepcopy=False)), SPACE)


def test_the_variants_that_beat_the_combined_seed_are_stacked() -> None:
    stacked = _stacked([(COMBINED, 0.36), (LOSS, 0.28), (FUSED, 0.35), (SPLIT, 0.40)])
    assert stacked == SPACE.complete({**COMBINED, "compile_scope": "model+loss", "optimizer_impl": "fused"})


def test_nothing_is_stacked_before_every_variant_finished_or_with_one_winner() -> None:
    assert _stacked([(COMBINED, 0.36), (LOSS, 0.28), (FUSED, 0.35)]) is None  # SPLIT not measured yet
    assert _stacked([(COMBINED, 0.36), (LOSS, 0.28), (FUSED, 0.37), (SPLIT, 0.40)]) is None
    assert _stacked([(COMBINED, 0.36), (LOSS, None), (FUSED, 0.35), (SPLIT, 0.30)]) == SPACE.complete(
        {**COMBINED, "optimizer_impl": "fused", "micro_batches": "2"}
    )  # a failed variant is no winner
    assert _stacked([(COMBINED, None), (LOSS, 0.28), (FUSED, 0.35), (SPLIT, 0.30)]) is None


def test_a_stacked_setting_the_study_holds_is_not_asked_for_again() -> None:
    both = SPACE.complete({**COMBINED, "compile_scope": "model+loss", "optimizer_impl": "fused"})
    assert _stacked([(COMBINED, 0.36), (LOSS, 0.28), (FUSED, 0.35), (SPLIT, 0.40), (both, 0.27)]) is None


def test_a_study_without_a_plan_stacks_nothing() -> None:
    study = optuna.create_study()
    assert stacked_setting(study, [], SPACE) is None
