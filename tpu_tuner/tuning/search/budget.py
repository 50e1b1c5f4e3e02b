"""The default search budget: a share of the settings the agents would measure.

A fixed default (it was 12 measured settings) fitted the first space of 18 settings; with the
knob registry a training step's space holds 180 settings the agents would measure on CPU
(examples/gpt.py), and replays of its measured grid put TPE with the agents' seeds within 3% of
the grid's best after a median of 11 and at most 21 measured trials, which 12 misses about half
the time (docs/search-efficiency.md). So the budget follows the space: `BUDGET_SHARE` of the
settings no agent rejects statically, at least `MIN_TRIALS` (small spaces are then covered
whole) and at most `MAX_TRIALS` (a big space's default run stays minutes, not hours). A grid
search gets every such setting. `--trials` overrides it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpu_tuner.tuning.agents.base import Agent
from tpu_tuner.tuning.search.search_space import SearchSpace

BUDGET_SHARE = 0.20
MIN_TRIALS = 12
MAX_TRIALS = 48


@dataclass(frozen=True)
class Budget:
    """How many settings the search measures, and what it was derived from."""

    trials: int
    measurable: int  # settings of the space that no agent rejects without measuring
    automatic: bool

    def describe(self) -> str:
        if not self.automatic:
            return (
                f"budget {self.trials} measured settings (--trials), of the {self.measurable} settings of the space "
                "that no rule refuses unmeasured"
            )
        return (
            f"budget {self.trials} measured settings: {BUDGET_SHARE:.0%} of the {self.measurable} settings of the "
            "space that no rule refuses unmeasured (one that cannot help this workload, or cannot run: the "
            f"progress and report.md say which), within {MIN_TRIALS}-{MAX_TRIALS} (--trials sets it)"
        )


def measurable_settings(space: SearchSpace, agents: list[Agent]) -> int:
    """Settings of `space` that no agent's `validate` rejects (rejections cost no measurement)."""
    candidates = map(space.to_candidate, space.settings())
    return sum(1 for candidate in candidates if not any(agent.validate(candidate) for agent in agents))


def search_budget(trials: int | None, sampler: str, space: SearchSpace, agents: list[Agent]) -> Budget:
    """`trials` when given; otherwise the automatic budget for this space and these agents."""
    measurable = measurable_settings(space, agents)
    if trials is not None:
        return Budget(trials, measurable, automatic=False)
    if sampler == "grid":
        return Budget(max(1, measurable), measurable, automatic=True)
    share = math.ceil(BUDGET_SHARE * measurable)
    return Budget(min(MAX_TRIALS, max(MIN_TRIALS, share)), measurable, automatic=True)
