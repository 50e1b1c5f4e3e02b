"""The error band of a prediction: how far its MFU may be off, from the calibration's own misses.

Every calibration row (a published run, planner/calibration.py) has a leave-one-out error: its
prediction's miss when the constants are fitted to the other rows. A new point's band is a
quantile of those misses, of the rows comparable to it, and it widens with the point's distance
from the calibration:

* **comparable rows**: the rows of the point's generation and remat family; with fewer than
  `MIN_COMPARABLE` (9) of them, the generation's rows; then every row. Nine is the fewest whose
  90% quantile below exists: the largest of n rows covers a new one only n / (n + 1) of the time
  (3 rows: 75%);
* **the quantile**: the split-conformal one, the ceil(0.9 (n + 1))-th smallest of n absolute
  errors (the largest where n < 9), so that a new point like the rows is covered at least 90% of
  the time when the rows are exchangeable (Vovk et al., "Algorithmic Learning in a Random World";
  Lei et al. 2018, https://arxiv.org/abs/1604.04173);
* **a floor**: a published recipe measured again differed by up to a few MFU points (software
  drift, run-to-run noise: the superseded rows of benchmarks/published_runs.toml); a band is never
  narrower than the same quantile of those differences;
* **distance**: a generation, a remat family on that generation, a sequence length or a
  per-device batch with no calibration row within a factor `NEAR` is a gap, and each gap is
  named in the band's reasons ("extrapolated: no calibration row with full remat on v6e"). A
  point with gaps gets at least the quantile of the rows that had the same kinds of gap
  themselves when left out (their errors are what extrapolating that way cost). A generation with
  no rows is measured the same way, by leaving out whole generations: the quantile of each row's
  error when no row of its generation was fitted (`BandRow.unseen_generation_error`), widened by
  `WIDEN` per further gap. Where fewer than `MIN_COMPARABLE` rows measure a gap, the largest error
  seen, widened by `WIDEN` per gap (an assumption, said in the band's source).

Plain data, no JAX: the planner computes a band per point, the calibration its coverage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

COVERAGE = 0.9
# The fewest rows whose conformal quantile is one of them (ceil(0.9 (n + 1)) <= n: 9): fewer rows
# cannot promise the coverage, so a band from them would be narrower than it claims.
MIN_COMPARABLE = next(n for n in range(1, 1000) if math.ceil(COVERAGE * (n + 1)) <= n)
NEAR = 2.0  # a row within this factor of the point's sequence length / per-device batch is nearby
WIDEN = 0.25  # beyond the rows' own distances: the largest error seen x (1 + WIDEN x gaps)


@dataclass(frozen=True)
class Place:
    """Where a prediction sits: what the band compares with the calibration rows."""

    generation: str
    remat_family: str
    seq: int
    per_device_batch: float


@dataclass(frozen=True)
class BandRow(Place):
    """One calibration row's place and its leave-one-out error (MFU points, predicted - published);
    `unseen_generation_error`: its error when no row of its generation was fitted (None: not
    measured, or its generation is the only one)."""

    error: float
    unseen_generation_error: float | None = None


@dataclass(frozen=True)
class ErrorBand:
    """How far a predicted MFU may be off, in MFU points, where that figure comes from, and the
    gaps between the point and the calibration (empty: interpolated)."""

    points: float
    source: str
    reasons: tuple[str, ...] = ()


def conformal_quantile(values: list[float], coverage: float = COVERAGE) -> float:
    """The ceil(coverage (n + 1))-th smallest of `values` (the largest where that exceeds n)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    k = math.ceil(coverage * (len(ordered) + 1))
    return ordered[min(k, len(ordered)) - 1]


def _near(a: float, b: float) -> bool:
    return a > 0 and b > 0 and max(a, b) / min(a, b) <= NEAR


def gap_kinds(place: Place, rows: list[BandRow] | list[Place]) -> dict[str, str]:
    """The dimensions in which no calibration row is near `place` ("generation", "remat",
    "sequence", "batch"), each with its reason."""
    g = place.generation
    own = [r for r in rows if r.generation == g]
    out = {}
    if not own:
        out["generation"] = f"no calibration row on {g}"
        own, where = list(rows), "any generation"  # the other dimensions, judged over every row
    else:
        where = g
    if not any(r.remat_family == place.remat_family for r in own):
        out["remat"] = f"no calibration row with {place.remat_family} remat on {where}"
    if not any(_near(r.seq, place.seq) for r in own):
        out["sequence"] = f"no calibration row on {where} within {NEAR:g}x of sequence {place.seq}"
    if not any(_near(r.per_device_batch, place.per_device_batch) for r in own):
        out["batch"] = f"no calibration row on {where} within {NEAR:g}x of per-device batch {place.per_device_batch:g}"
    return out


def gaps(place: Place, rows: list[BandRow] | list[Place]) -> list[str]:
    """The dimensions in which no calibration row is near `place`, as reasons."""
    return list(gap_kinds(place, rows).values())


def comparable(place: Place, rows: list[BandRow]) -> tuple[list[BandRow], str]:
    """The rows whose errors stand for `place`'s, and which they are, in words."""
    same = [r for r in rows if r.generation == place.generation and r.remat_family == place.remat_family]
    if len(same) >= MIN_COMPARABLE:
        return same, f"the {len(same)} {place.generation} rows with {place.remat_family} remat"
    generation = [r for r in rows if r.generation == place.generation]
    if len(generation) >= MIN_COMPARABLE:
        return generation, f"the {len(generation)} {place.generation} rows"
    return list(rows), f"all {len(rows)} rows"


def error_band(place: Place, rows: list[BandRow], floor: float = 0.0) -> ErrorBand | None:
    """The band of a prediction at `place` from the calibration rows' leave-one-out errors
    (None without rows: an uncalibrated cost model). `floor`: the spread of the same published
    recipe measured again (no prediction can be surer than the figure it predicts)."""
    if not rows:
        return None
    near, which = comparable(place, rows)
    points = conformal_quantile([abs(r.error) for r in near])
    source = f"{COVERAGE:.0%} quantile of the leave-one-out errors of {which}"
    if floor > points:
        points = floor
        source += f", raised to the {floor:.1f}-point spread of published recipes measured again"
    kinds = gap_kinds(place, rows)
    if kinds:
        m = len(kinds)
        # The rows that, left out, had every one of these gaps themselves: their errors are what
        # extrapolating that way cost.
        far = [r for i, r in enumerate(rows) if set(kinds) <= set(gap_kinds(r, rows[:i] + rows[i + 1 :]))]
        unseen = [abs(r.unseen_generation_error) for r in rows if r.unseen_generation_error is not None]
        if "generation" in kinds and len(far) < MIN_COMPARABLE and len(unseen) >= MIN_COMPARABLE:
            points = max(points, conformal_quantile(unseen)) * (1 + WIDEN * (m - 1))
            source += (
                f"; for a generation without rows, the {COVERAGE:.0%} quantile of the {len(unseen)} rows' "
                "errors when their own generation was left out of the fit"
                + (f", widened by {WIDEN:.0%} per further gap (assumed)" if m > 1 else "")
            )
        elif len(far) >= MIN_COMPARABLE:
            points = max(points, conformal_quantile([abs(r.error) for r in far]))
            source += f"; widened to that of the {len(far)} rows that had the same gaps when left out"
        else:
            points = max(points, max(abs(r.error) for r in rows)) * (1 + WIDEN * m)
            source += (
                f"; fewer than {MIN_COMPARABLE} rows had the same gaps: the largest error seen, "
                f"widened by {WIDEN:.0%} per gap (assumed)"
            )
    return ErrorBand(points, source, tuple(f"extrapolated: {r}" for r in kinds.values()))


__all__ = [
    "BandRow",
    "COVERAGE",
    "ErrorBand",
    "MIN_COMPARABLE",
    "NEAR",
    "Place",
    "conformal_quantile",
    "comparable",
    "error_band",
    "gap_kinds",
    "gaps",
]
