"""The error band of a prediction: how far its MFU may be off, from the calibration's own misses.

Every calibration row (a published run, planner/calibration/fitting.py) has a leave-one-out error: its
prediction's miss when the constants are fitted to the other rows. A new point's band is a
quantile of the misses of the rows most like it:

* **alike**: a row is as far from the point as its differences weigh (`MISMATCH`): another
  generation, MoE kind (dense, dropping, dropless), remat family, host offload or slice count
  (one or several), and each doubling between their sequence lengths and per-device batches
  (`PER_DOUBLING`). The point's rows are its `MIN_COMPARABLE` (9) nearest, with any row as near
  as the ninth. Nine is the fewest whose 90% quantile below exists: the largest of n rows covers
  a new one only n / (n + 1) of the time (3 rows: 75%). Where fewer than nine rows are alike (no
  difference), the nearest unlike ones fill the set: the fallback, and the band's source says
  how many were alike and what the others differ in. A dimension the point does not state
  (None) is not compared. The rows of other kinds (the dropless MoE rows' 11-21-point misses)
  no longer set the band of a point unlike them;
* **errors measured as the point is predicted**: a row's leave-one-out error measured an
  interpolation only if each constant its prediction takes from rows (`fitted_groups`: its
  generation's efficiency, or its dropless MoE one; over several slices, the DCN step's latency)
  was still fitted from another row when it was left out. A row alone in such a group was
  predicted with a fallback (an unseen chip's efficiency, efficiency_prior.py; a DCN latency of 0): its error is an
  extrapolation's (the lone v5e row's; in the nested check, a row whose twin is the one held
  out). A point whose every group has rows is predicted by interpolation, so its band is made of
  the interpolated rows alone (the errors split by kind, as Vovk et al.'s Mondrian conformal
  predictors split them); a point with a group no row fits keeps every row;
* **the quantile**: the split-conformal one, the ceil(0.9 (n + 1))-th smallest of n absolute
  errors (the largest where n < 9), so that a new point like the rows is covered at least 90% of
  the time when the rows are exchangeable (Vovk et al., "Algorithmic Learning in a Random World";
  Lei et al. 2018, https://arxiv.org/abs/1604.04173);
* **a floor**: a published recipe measured again differed by up to a few MFU points (software
  drift, run-to-run noise: the superseded rows of benchmarks/planner/published_runs.toml); a band is never
  narrower than the same quantile of those differences;
* **a generation without rows**: leave-one-out errors say nothing about a chip the fit never saw,
  so such a point gets the quantile of the errors its rows had when no row of their generation
  was fitted (`BandRow.unseen_generation_error`): of the `MIN_COMPARABLE` rows most like it, as
  above with the generation not compared (every row is of another), so a dense point no longer
  takes the MoE and long-context rows' misses; widened by `WIDEN` per further gap; with fewer than
  `MIN_COMPARABLE` such errors, the largest leave-one-out error, widened by `WIDEN` per gap (an
  assumption, said in the band's source).

A generation, remat family, sequence length or per-device batch with no row near it is still
named in the band's reasons ("extrapolated: no calibration row with full remat on v6e"). What the
planner prints goes through novelty.band_far: widened where the point is far from its
generation's rows, and with `group_points`, the same rows' misses with their source table or
model family left out (issue 70).

Plain data, no JAX: the planner computes a band per point, the calibration its coverage.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

COVERAGE = 0.9
# The fewest rows whose conformal quantile is one of them (ceil(0.9 (n + 1)) <= n: 9): fewer rows
# cannot promise the coverage, so a band from them would be narrower than it claims.
MIN_COMPARABLE = next(n for n in range(1, 1000) if math.ceil(COVERAGE * (n + 1)) <= n)
NEAR = 2.0  # a row within this factor of the point's sequence length / per-device batch is nearby
WIDEN = 0.25  # a generation without rows, per further gap (assumed): x (1 + WIDEN x gaps)
# What a difference costs in the distance from a point to a row, fixed before measuring coverage.
# Generation and MoE kind weigh double: each carries its own fitted or unmodelled costs (an
# efficiency per chip; grouped matmuls and sorts), so a row of another chip or kind is a worse
# stand-in than one of another remat policy or slice count.
MISMATCH = {"generation": 2.0, "moe": 2.0, "remat": 1.0, "offload": 1.0, "slices": 1.0}
# Per doubling between the point's and the row's sequence length / per-device batch.
PER_DOUBLING = {"sequence": 0.5, "batch": 0.25}


@dataclass(frozen=True)
class Place:
    """Where a prediction sits: what the band compares with the calibration rows. `moe`: "dense",
    "dropping" (capacity-factor MoE) or "dropless"; `moe`, `offload`, `slices`, `chips` and `layout`
    may be None (not stated: not compared), and `offload` None reads the remat family ("offload"
    offloads)."""

    generation: str
    remat_family: str
    seq: int
    per_device_batch: float
    moe: str | None = field(default=None, kw_only=True)
    offload: bool | None = field(default=None, kw_only=True)
    slices: int | None = field(default=None, kw_only=True)
    # The chips of one slice and the layout's kind (novelty.layout_kind): how far the point is from
    # its generation's rows (novelty.py); None: not stated, not compared.
    chips: int | None = field(default=None, kw_only=True)
    layout: str | None = field(default=None, kw_only=True)

    @property
    def offloads(self) -> bool:
        """Whether the step keeps tensors in host memory."""
        return self.remat_family == "offload" if self.offload is None else self.offload


@dataclass(frozen=True)
class BandRow(Place):
    """One calibration row's place and its leave-one-out error (MFU points, predicted - published);
    `unseen_generation_error`: its error when no row of its generation was fitted (None: not
    measured, or its generation is the only one)."""

    error: float
    unseen_generation_error: float | None = None
    # Its error when its source table, or its model family, was left out of the fit (the larger;
    # calibration/group_check.py): what the band's `group_points` are made of. None: not measured.
    group_error: float | None = None


@dataclass(frozen=True)
class ErrorBand:
    """How far a predicted MFU may be off, in MFU points, where that figure comes from, and the
    gaps between the point and the calibration (empty: interpolated)."""

    points: float
    source: str
    reasons: tuple[str, ...] = ()
    # The group-wise width: the same rows' errors when their source table or model family was
    # left out, as a run from a table the calibration has not seen would be predicted (None: the
    # rows carry none).
    group_points: float | None = None


def conformal_quantile(values: list[float], coverage: float = COVERAGE) -> float:
    """The ceil(coverage (n + 1))-th smallest of `values` (the largest where that exceeds n)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    k = math.ceil(coverage * (len(ordered) + 1))
    return ordered[min(k, len(ordered)) - 1]


def _near(a: float, b: float) -> bool:
    return a > 0 and b > 0 and max(a, b) / min(a, b) <= NEAR


def _doublings(a: float, b: float) -> float:
    return abs(math.log2(a / b)) if a > 0 and b > 0 else 1.0


def differences(place: Place, row: Place, *, generation: bool = True) -> list[str]:
    """The dimensions in which `row` is unlike `place` (unstated ones not compared; a sequence or
    batch when not within `NEAR`; the generation only where `generation`)."""
    out = []
    if generation and row.generation != place.generation:
        out.append("generation")
    if place.moe is not None and row.moe is not None and row.moe != place.moe:
        out.append("moe")
    if row.remat_family != place.remat_family:
        out.append("remat")
    if row.offloads != place.offloads:
        out.append("offload")
    if place.slices and row.slices and (row.slices > 1) != (place.slices > 1):
        out.append("slices")
    if not _near(row.seq, place.seq):
        out.append("sequence")
    if not _near(row.per_device_batch, place.per_device_batch):
        out.append("batch")
    return out


def distance(place: Place, row: Place, *, generation: bool = True) -> float:
    """How unlike `row` is to `place`: the `MISMATCH` weights of their differences (the generation
    only where `generation`), plus `PER_DOUBLING` for each doubling between their sequence lengths
    and per-device batches."""
    categorical = sum(MISMATCH.get(d, 0.0) for d in differences(place, row, generation=generation))
    return (
        categorical
        + PER_DOUBLING["sequence"] * _doublings(row.seq, place.seq)
        + PER_DOUBLING["batch"] * _doublings(row.per_device_batch, place.per_device_batch)
    )


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


def fitted_groups(place: Place) -> tuple[tuple[str, ...], ...]:
    """The groups of rows whose fitted constants a prediction at `place` takes, as the adopted fit
    (calibration.fitting: per_generation+dcn+route) groups them: its generation's efficiency (a
    dropless MoE step's too), for a dropless step the route passes (fitted to every generation's
    dropless rows: the "+route" term) and, over several slices, the DCN step latency's (fitted to
    the multi-slice rows alone: the "+dcn" term)."""
    out: list[tuple[str, ...]] = [("efficiency", place.generation, "dense")]
    if place.moe == "dropless":
        out.append(("route",))
    if place.slices and place.slices > 1:
        out.append(("dcn",))
    return tuple(out)


def interpolated_rows(place: Place, rows: list[BandRow]) -> list[BandRow]:
    """The rows whose leave-one-out errors stand for `place`'s as it is predicted: where each of
    its `fitted_groups` has rows, the rows that had another row of each of their own groups in
    their leave-one-out fit (the others' errors were extrapolations); where one has none, or
    fewer than `MIN_COMPARABLE` rows remain, every row."""
    count = Counter(g for r in rows for g in fitted_groups(r))
    if not all(count[g] for g in fitted_groups(place)):
        return list(rows)
    kept = [r for r in rows if all(count[g] >= 2 for g in fitted_groups(r))]
    return kept if len(kept) >= MIN_COMPARABLE else list(rows)


def nearest(place: Place, rows: list[BandRow], *, generation: bool = True) -> list[BandRow]:
    """`rows`' `MIN_COMPARABLE` nearest to `place` (`distance`, the generation compared only
    where `generation`), with any row as near as the last of them; all of them where fewer."""
    far = [distance(place, r, generation=generation) for r in rows]
    radius = sorted(far)[min(MIN_COMPARABLE, len(rows)) - 1]
    return [r for r, d in zip(rows, far) if d <= radius + 1e-9]


def comparable(place: Place, rows: list[BandRow]) -> tuple[list[BandRow], str]:
    """The rows whose errors stand for `place`'s: of the `interpolated_rows`, its `MIN_COMPARABLE`
    nearest (`distance`), with any row as near as the last of them (all rows where there are
    fewer), and which they are."""
    pool = interpolated_rows(place, rows)
    left_out = len(rows) - len(pool)
    near = nearest(place, pool)
    alike = sum(1 for r in near if not differences(place, r))
    unlike: dict[str, int] = {}
    for r in near:
        for d in differences(place, r):
            unlike[d] = unlike.get(d, 0) + 1
    which = f"the {len(near)} rows most like it ({alike} alike"
    if unlike:  # the fallback: too few alike, the nearest unlike rows fill the set
        which += "; the others unlike it in " + ", ".join(f"{d} ({n})" for d, n in unlike.items())
    if left_out:
        which += (
            f"; left out: {left_out} extrapolated error{'s' if left_out > 1 else ''}, each of a row with no "
            "other row of its chip's efficiency or DCN term in its fit"
        )
    return near, which + ")"


def unseen_comparable(place: Place, measured: list[BandRow]) -> tuple[list[BandRow], str]:
    """For a point of a generation without rows, the rows whose errors with their generation left
    out stand for its own: its `nearest` with the generation not compared (every row is of
    another); every row where another of its `fitted_groups` (the route passes, the DCN step) has
    no row either, as `interpolated_rows` keeps every row for a point predicted with a fallback, and
    where fewer than `MIN_COMPARABLE` rows are of its MoE kind (split by kind, Mondrian: fewer
    errors of its kind cannot give their 90% quantile, and the nearest would be of another kind)."""
    count = Counter(g for r in measured for g in fitted_groups(r))
    unfitted = [g[0] for g in fitted_groups(place)[1:] if not count[g]]
    if unfitted:
        return list(measured), f"every row ({len(measured)}: no row fits its {' or '.join(unfitted)} term either)"
    kind = [r for r in measured if "moe" not in differences(place, r, generation=False)]
    if len(kind) < MIN_COMPARABLE:
        return list(measured), f"every row ({len(measured)}: {len(kind)} of its MoE kind, {place.moe})"
    alike = nearest(place, measured, generation=False)
    return alike, f"the {len(alike)} rows most like it (generation not compared)"


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
    if "generation" in kinds:
        m = len(kinds)
        measured = [r for r in rows if r.unseen_generation_error is not None]
        if len(measured) >= MIN_COMPARABLE:
            alike, which = unseen_comparable(place, measured)
            unseen = [abs(r.unseen_generation_error or 0.0) for r in alike]
            points = max(points, conformal_quantile(unseen)) * (1 + WIDEN * (m - 1))
            source += (
                f"; for a generation without rows, the {COVERAGE:.0%} quantile of the errors of {which} "
                "when their own generation was left out of the fit"
                + (f", widened by {WIDEN:.0%} per further gap (assumed)" if m > 1 else "")
            )
        else:
            points = max(points, max(abs(r.error) for r in rows)) * (1 + WIDEN * m)
            source += (
                f"; fewer than {MIN_COMPARABLE} rows measured a generation left out: the largest error seen, "
                f"widened by {WIDEN:.0%} per gap (assumed)"
            )
    grouped = [abs(r.group_error) for r in near if r.group_error is not None]
    group_points = max(points, conformal_quantile(grouped)) if grouped else None  # said by novelty.band_far
    return ErrorBand(points, source, tuple(f"extrapolated: {r}" for r in kinds.values()), group_points)


def coverage_and_width(checked: list[tuple[float, ErrorBand]]) -> tuple[float, float]:
    """The share of errors inside their band (|error| <= band) and the median band (points, +-)."""
    if not checked:
        raise ValueError("no bands")
    inside = sum(abs(e) <= b.points for e, b in checked)
    widths = sorted(b.points for _, b in checked)
    n = len(widths)
    median = widths[n // 2] if n % 2 else (widths[n // 2 - 1] + widths[n // 2]) / 2
    return inside / n, median


__all__ = [
    "BandRow",
    "COVERAGE",
    "ErrorBand",
    "MIN_COMPARABLE",
    "MISMATCH",
    "NEAR",
    "PER_DOUBLING",
    "Place",
    "comparable",
    "conformal_quantile",
    "coverage_and_width",
    "differences",
    "distance",
    "error_band",
    "fitted_groups",
    "gap_kinds",
    "gaps",
    "interpolated_rows",
    "nearest",
    "unseen_comparable",
]
