"""Buckets judged on lengths they were not chosen on (`tpu-tune buckets --heldout-lengths FILE`).

Bounds fitted to one sample of lengths can look better on that sample than on the traffic that
follows. So the chosen bounds are also costed, and with `--replay` run, on a held-out sample: next
to the strategies that need no tuning, each made from the held-out lengths themselves (one shape
per length, pad to the longest, powers of two, multiples of 128), under the same measured cost
model. A held-out length longer than every chosen bound gets a bound of its own, aligned up, as a
pipeline padding to these bounds would have to compile it (buckets never truncate); the table
says how many such bounds were added.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tpu_tuner.model.buckets.bucket_choice import Evaluation, Strategy, baselines, evaluate
from tpu_tuner.model.buckets.bucket_cost import BucketCostModel
from tpu_tuner.model.buckets.lengths import LengthHistogram

# The no-tuning strategy every bucketing is measured against (docs/bucketing.md's target).
POWERS_OF_TWO = "powers of two"


@dataclass
class HeldOut:
    """The chosen bounds and the untuned strategies on a held-out length sample."""

    source: str  # the file's name
    samples: int
    distinct_lengths: int
    added_bounds: list[int]  # bounds added to the chosen ones for held-out lengths past them
    table: list[Evaluation] = field(default_factory=list)  # the chosen first, then the baselines

    def predicted_ratio(self, against: str = POWERS_OF_TWO) -> float | None:
        """The chosen bounds' predicted total over `against`'s, on the held-out lengths."""
        other = next((e for e in self.table if e.strategy.name == against), None)
        if other is None or other.total_seconds <= 0 or not self.table:
            return None
        return self.table[0].total_seconds / other.total_seconds


def covering(strategy: Strategy, hist: LengthHistogram, align: int) -> tuple[Strategy, list[int]]:
    """`strategy` with a bound for each length of `hist` past its largest (aligned up to `align`),
    and the bounds added."""
    largest = max(strategy.bounds)
    beyond = hist.lengths[hist.lengths > largest]
    added = sorted({int(math.ceil(int(length) / align) * align) for length in beyond})
    if not added:
        return strategy, []
    note = f"{strategy.note}; + {len(added)} bound(s) for held-out lengths past {largest}".lstrip("; ")
    return Strategy(strategy.name, tuple(sorted({*strategy.bounds, *added})), note), added


def held_out(
    chosen: Strategy,
    hist: LengthHistogram,
    source: Path,
    model: BucketCostModel,
    steps: int,
    max_buckets: int,
    align: int,
) -> HeldOut:
    """The held-out comparison: the chosen bounds (covering `hist`) and the baselines of `hist`,
    each evaluated under `model` over `steps` steps."""
    covered, added = covering(chosen, hist, align)
    strategies = [covered, *baselines(hist)]
    return HeldOut(
        source=Path(source).name,
        samples=int(np.sum(hist.counts)),
        distinct_lengths=len(hist.lengths),
        added_bounds=added,
        table=[evaluate(s, hist, model, steps, max_buckets) for s in strategies],
    )


__all__ = ["POWERS_OF_TWO", "HeldOut", "covering", "held_out"]
