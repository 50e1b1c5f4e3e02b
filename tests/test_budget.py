"""The default search budget follows the space: 20% of the settings the agents would measure,
12 to 48; a grid gets all of them; --trials overrides."""

from __future__ import annotations

from types import SimpleNamespace

from tpu_tuner.knobs.traits import WorkloadTraits
from tpu_tuner.tuning.space import SearchSpace
from tpu_tuner.tuning.budget import MAX_TRIALS, MIN_TRIALS, measurable_settings, search_budget


def _rejecting(**rejected: str) -> SimpleNamespace:
    """An agent that rejects every candidate with one of the given knob values."""
    return SimpleNamespace(validate=lambda candidate: next(
        (f"{name} rejected" for name, value in rejected.items() if candidate[name] == value), None))


def test_rejected_settings_are_not_counted_and_the_budget_is_a_fifth_of_the_rest() -> None:
    space = SearchSpace.load("default", "cpu").for_workload(WorkloadTraits(True, 0, 4, 8))
    agents = [_rejecting(matmul_precision="high"), _rejecting(matmul_precision="medium")]
    measurable = measurable_settings(space, agents)
    assert measurable * 3 == space.size()  # two of three precisions rejected
    budget = search_budget(None, "tpe", space, agents)
    assert budget.automatic and budget.measurable == measurable
    assert budget.trials == min(MAX_TRIALS, max(MIN_TRIALS, -(-measurable // 5)))
    assert "20% of the" in budget.describe()
    assert search_budget(None, "grid", space, agents).trials == measurable
    given = search_budget(7, "tpe", space, agents)
    assert given.trials == 7 and not given.automatic and "--trials" in given.describe()


def test_small_spaces_get_the_minimum_and_large_ones_the_cap() -> None:
    small = SearchSpace.load("precision", "cpu")
    assert search_budget(None, "tpe", small, []).trials == MIN_TRIALS
    large = SearchSpace.load("default", "cpu").for_workload(WorkloadTraits(True, 0, 4, 8))
    assert large.size() * 0.2 > MAX_TRIALS
    assert search_budget(None, "tpe", large, []).trials == MAX_TRIALS
