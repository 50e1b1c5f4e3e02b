"""Choose bucket bounds that minimise a planned run's expected total time, and the baselines.

The optimiser is exact under the cost model (see bucket_cost.py). A bucket's best bound is the
aligned ceiling of its longest member, so the candidate bounds are the m distinct aligned
ceilings of the sample's lengths, and a bucketing is a partition of them into contiguous runs.
With P the cumulative probability over candidates and x_j = S t(u_j):

    best[k][j] = C(u_j) + x_j P_j + min_{i<j} (best[k-1][i] - x_j P_i)

C(u_j), the measured cost of compiling bound u_j, depends on j alone, so it leaves the minimum
(and its hull) untouched: the optimiser stays exact with a compile cost that grows with length.

The inner minimum is over lines of slope -P_i, added in order of falling slope and queried at
rising x_j (t is increasing), so a convex-hull sweep answers it in amortised O(1): O(K m) time and
O(K m) memory for K buckets, against O(K m^2) for the plain recurrence (timing: docs/bucketing.md,
point 3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tpu_tuner.model.buckets.bucket_cost import BucketCostModel
from tpu_tuner.model.buckets.lengths import LengthHistogram


@dataclass(frozen=True)
class Strategy:
    """A bucketing: ascending bucket bounds; the last holds the longest length."""

    name: str
    bounds: tuple[int, ...]
    note: str = ""


@dataclass(frozen=True)
class Evaluation:
    """A strategy's expected costs over a planned run of `steps` steps, under a cost model."""

    strategy: Strategy
    compiled_shapes: int  # bounds that receive at least one length
    padding_waste: float  # fraction of the tokens processed that are padding
    compile_seconds: float
    step_seconds: float
    total_seconds: float
    within_limits: bool = True  # False when it compiles more shapes than --max-buckets allows
    padding_seconds: float = 0.0  # the steps' time beyond each step at its exact length


@dataclass(frozen=True)
class BucketShare:
    """One bucket of a strategy over the planned run: its compile against its padding.

    The trade the optimiser weighs: a new bound costs `compile_seconds` once, amortised over the
    `expected_steps` the run sends to it; merging it into the next bound instead costs padding."""

    bound: int
    expected_steps: float  # planned steps x the share of lengths this bucket holds
    compile_seconds: float
    compile_per_step: float  # compile_seconds / expected_steps
    padding_seconds: float  # expected extra step time over the run from padding to `bound`
    padding_per_step: float  # padding_seconds / expected_steps


def assign(hist: LengthHistogram, bounds: tuple[int, ...]) -> np.ndarray:
    """Index of the bucket (smallest bound >= length) of each distinct length."""
    index = np.searchsorted(np.asarray(bounds), hist.lengths, side="left")
    if index.max() >= len(bounds):
        raise ValueError(f"length {hist.max_length} exceeds the largest bucket {bounds[-1]}: buckets never truncate")
    return index


def evaluate(
    strategy: Strategy, hist: LengthHistogram, model: BucketCostModel, steps: int, max_buckets: int | None = None
) -> Evaluation:
    """Expected compile, step and total seconds of `strategy` over `steps` steps."""
    bounds = np.asarray(strategy.bounds)
    index = assign(hist, strategy.bounds)
    padded = bounds[index]
    used = len(np.unique(index))
    probabilities = hist.probabilities()
    step_total = steps * float(np.sum(probabilities * model.step_seconds(padded)))
    exact_total = steps * float(np.sum(probabilities * model.step_seconds(hist.lengths)))
    compile_total = float(np.sum(model.compile_seconds_at(bounds[np.unique(index)])))
    waste = float(np.sum(hist.counts * (padded - hist.lengths)) / np.sum(hist.counts * padded))
    return Evaluation(
        strategy,
        used,
        waste,
        compile_total,
        step_total,
        compile_total + step_total,
        max_buckets is None or used <= max_buckets,
        step_total - exact_total,
    )


def bucket_shares(strategy: Strategy, hist: LengthHistogram, model: BucketCostModel, steps: int) -> list[BucketShare]:
    """Each used bound of `strategy`: expected steps, compile and padding seconds over the run."""
    index = assign(hist, strategy.bounds)
    probabilities = hist.probabilities()
    extra = np.asarray(model.step_seconds(np.asarray(strategy.bounds)[index])) - np.asarray(
        model.step_seconds(hist.lengths)
    )
    shares = []
    for bucket in np.unique(index):
        members = index == bucket
        expected = steps * float(np.sum(probabilities[members]))
        bound = int(strategy.bounds[bucket])
        compile_seconds = float(model.compile_seconds_at(bound))
        padding = steps * float(np.sum(probabilities[members] * extra[members]))
        shares.append(
            BucketShare(bound, expected, compile_seconds, compile_seconds / expected, padding, padding / expected)
        )
    return shares


def oracle_seconds(hist: LengthHistogram, model: BucketCostModel, steps: int) -> float:
    """The lower bound: every step at its exact length, compiles free."""
    return steps * float(np.sum(hist.probabilities() * model.step_seconds(hist.lengths)))


def optimal_buckets(
    hist: LengthHistogram, model: BucketCostModel, steps: int, max_buckets: int = 8, align: int = 1
) -> Strategy:
    """The bounds (multiples of `align`, at most `max_buckets`) with the least expected total time."""
    if max_buckets < 1 or align < 1:
        raise ValueError("max_buckets and align must be at least 1")
    aligned = (hist.lengths + align - 1) // align * align
    candidates, inverse = np.unique(aligned, return_inverse=True)
    mass = np.bincount(inverse, weights=hist.probabilities())
    cumulative = np.concatenate([[0.0], np.cumsum(mass)]).tolist()
    m = len(candidates)
    x = [0.0] + (steps * np.asarray(model.step_seconds(candidates.astype(float)))).tolist()
    monotone = all(x[j] <= x[j + 1] for j in range(1, m))
    compile_cost = [0.0] + np.asarray(model.compile_seconds_at(candidates.astype(float))).tolist()
    previous = [0.0] + [math.inf] * m
    parents: list[list[int]] = []
    best_total, best_k = math.inf, 0
    for k in range(1, min(max_buckets, m) + 1):
        current = [math.inf] * (m + 1)
        parent = [0] * (m + 1)
        hull: list[int] = []  # candidate split points i, lines y = previous[i] - x P_i
        pointer = 0
        for j in range(1, m + 1):
            i = j - 1
            if previous[i] < math.inf:
                _push(hull, i, previous, cumulative)
                pointer = min(pointer, len(hull) - 1)
            if not hull:
                continue
            if monotone:
                while pointer + 1 < len(hull) and _line(hull[pointer + 1], x[j], previous, cumulative) <= _line(
                    hull[pointer], x[j], previous, cumulative
                ):
                    pointer += 1
                split = hull[pointer]
            else:
                split = min(hull, key=lambda h: _line(h, x[j], previous, cumulative))
            current[j] = compile_cost[j] + x[j] * cumulative[j] + _line(split, x[j], previous, cumulative)
            parent[j] = split
        parents.append(parent)
        if current[m] < best_total:
            best_total, best_k = current[m], k
        previous = current
    bounds = []
    j = m
    for k in range(best_k, 0, -1):
        bounds.append(int(candidates[j - 1]))
        j = parents[k - 1][j]
    note = f"exact DP over {m} candidate bounds (multiples of {align}), at most {max_buckets} buckets"
    return Strategy("optimal (DP)", tuple(sorted(bounds)), note)


def _line(i: int, x: float, intercepts: list[float], cumulative: list[float]) -> float:
    return intercepts[i] - x * cumulative[i]


def _push(hull: list[int], i: int, intercepts: list[float], cumulative: list[float]) -> None:
    """Add line i (slope -P_i, below all earlier slopes) to the lower envelope."""
    while len(hull) >= 2:
        a, b = hull[-2], hull[-1]
        # b is useless when the a-i crossing comes no later than the a-b crossing.
        if (intercepts[i] - intercepts[a]) * (cumulative[b] - cumulative[a]) <= (intercepts[b] - intercepts[a]) * (
            cumulative[i] - cumulative[a]
        ):
            hull.pop()
        else:
            break
    hull.append(i)


def baselines(hist: LengthHistogram) -> list[Strategy]:
    """The strategies users reach for without tpu-tune."""
    longest = hist.max_length
    low = max(1, int(hist.lengths[0]))
    powers = tuple(2**k for k in range(math.ceil(math.log2(low)), math.ceil(math.log2(longest)) + 1))
    multiples = tuple(range(128, math.ceil(longest / 128) * 128 + 1, 128))
    return [
        Strategy("no bucketing", tuple(int(v) for v in hist.lengths), "compile every distinct length"),
        Strategy("pad to max", (longest,), "one shape"),
        Strategy("powers of two", powers, "serving stacks' ladder"),
        Strategy("multiples of 128", multiples, "TorchTPU's bucket_size default"),
    ]
