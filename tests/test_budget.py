"""The default search budget follows the space (tuning/search/budget.py's documented rule): a fifth of the
settings the agents would measure, rounded up, no fewer than 12 and no more than 48; a grid gets
all of them; --trials overrides. Spaces of a known size, built here, so each figure below is the
rule worked by hand, not the formula run again."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tpu_tuner.knobs.traits import WorkloadTraits
from tpu_tuner.tuning.search.budget import measurable_settings, search_budget
from tpu_tuner.tuning.search.search_space import Param, SearchSpace

# Knobs without conditions, with their number of choices: a space's size is the product.
CHOICES = {
    "matmul_precision": ("highest", "high", "medium"),
    "autocast": ("none", "bfloat16", "float16"),
    "memory_format": ("contiguous", "channels_last"),
    "activation_checkpointing": ("none", "blocks", "every_2nd"),
    "optimizer_impl": ("default", "forloop", "foreach", "fused"),
    "micro_batches": ("1", "2", "4", "8"),
}


def _space(*names: str) -> SearchSpace:
    return SearchSpace("known", "cpu", tuple(Param(name, "test", CHOICES[name]) for name in names))


def _rejecting(**rejected: str) -> SimpleNamespace:
    """An agent that rejects every candidate with one of the given knob values."""
    return SimpleNamespace(
        validate=lambda candidate: next(
            (f"{name} rejected" for name, value in rejected.items() if candidate[name] == value), None
        )
    )


@pytest.mark.parametrize(
    ("names", "size", "trials"),
    [
        (("matmul_precision",), 3, 12),  # a fifth is 1: the floor, which covers the space whole
        (("matmul_precision", "autocast", "memory_format", "optimizer_impl"), 72, 15),  # 14.4 rounded up
        (("autocast", "memory_format", "optimizer_impl", "micro_batches"), 96, 20),  # 19.2 rounded up
        (("matmul_precision", "autocast", "memory_format", "activation_checkpointing", "optimizer_impl"), 216, 44),
        (("matmul_precision", "autocast", "memory_format", "optimizer_impl", "micro_batches"), 288, 48),  # 58: the cap
    ],
)
def test_the_budget_is_a_fifth_of_the_space_within_12_to_48(names: tuple[str, ...], size: int, trials: int) -> None:
    space = _space(*names)
    assert space.size() == size
    budget = search_budget(None, "tpe", space, [])
    assert (budget.trials, budget.measurable, budget.automatic) == (trials, size, True)
    assert f"budget {trials} measured settings: 20% of the {size} settings of the space that no rule refuses" in (
        budget.describe()
    )


def test_settings_an_agent_rejects_are_not_counted() -> None:
    space = _space("matmul_precision", "autocast", "memory_format", "optimizer_impl", "micro_batches")  # 288
    no_fp16 = [_rejecting(autocast="float16")]  # a third of the settings
    assert measurable_settings(space, no_fp16) == 192
    assert search_budget(None, "tpe", space, no_fp16).trials == 39  # 38.4 rounded up: now under the cap
    two_agents = [*no_fp16, _rejecting(micro_batches="8")]  # and a quarter of the rest
    assert measurable_settings(space, two_agents) == 144
    assert search_budget(None, "tpe", space, two_agents).trials == 29


def test_a_grid_measures_every_measurable_setting_and_trials_override() -> None:
    space = _space("matmul_precision", "autocast", "memory_format", "optimizer_impl", "micro_batches")
    no_fp16 = [_rejecting(autocast="float16")]
    assert search_budget(None, "grid", space, no_fp16).trials == 192  # past the cap: a grid is whole
    assert (
        search_budget(None, "grid", space, [_rejecting(matmul_precision=v) for v in CHOICES["matmul_precision"]]).trials
        == 1
    )  # nothing measurable: still one trial
    given = search_budget(7, "tpe", space, no_fp16)
    assert (given.trials, given.measurable, given.automatic) == (7, 192, False)
    assert (
        "budget 7 measured settings (--trials), of the 192 settings of the space that no rule refuses unmeasured"
        == (given.describe())
    )
    assert search_budget(300, "grid", space, []).trials == 300


def test_the_default_spaces_small_and_large() -> None:
    """The shipped spaces: the precision space is under the floor, a training step's default
    space over the cap; rejecting two of three matmul precisions leaves a third of it."""
    assert search_budget(None, "tpe", SearchSpace.load("precision", "cpu"), []).trials == 12
    large = SearchSpace.load("default", "cpu").for_workload(WorkloadTraits(True, 0, 4, 8))
    assert search_budget(None, "tpe", large, []).trials == 48
    agents = [_rejecting(matmul_precision="high"), _rejecting(matmul_precision="medium")]
    assert measurable_settings(large, agents) * 3 == large.size()
