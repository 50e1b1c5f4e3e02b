"""The bands checked with whole groups of rows left out: a generation, a source, a model family.

`fitting.band_check` leaves out one row while its generation, its source table and its model
family stay in, so it cannot show what a run from a table the calibration has not seen costs
(issue 70). Here each group of a grouping (`GROUPINGS`) is left out in turn: its rows are
predicted with the constants fitted to the other groups' rows, and each gets the band made from
the other groups' rows alone (their leave-one-out errors and places, as `band_check` makes it
for one row), so no row of the group enters its own fit or band.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from tpu_tuner.planner.calibration.fitting import Fitted, band_rows, errors, fit, place_of
from tpu_tuner.planner.calibration.rows import CalibrationRow
from tpu_tuner.planner.prediction.band import BandRow, ErrorBand, coverage_and_width, error_band
from tpu_tuner.planner.prediction.novelty import distance as novelty_distance
from tpu_tuner.planner.prediction.novelty import novelties, widened

# What a row is grouped by: its chip, its published table or log, its model family.
GROUPINGS: dict[str, Callable[[CalibrationRow], str]] = {
    "generation": lambda r: r.generation,
    "source": lambda r: r.source,
    "family": lambda r: r.family,
}


@dataclass(frozen=True)
class Checked:
    """One row's error with its group left out of the fit, and the band it would have had:
    `base`, the band before widening (points), and `novel`, its novelties against the rows its band
    was made of (novelty.py); `unseen`: no row of its generation was among them (band.py's rule for
    a generation without rows made its band)."""

    row: CalibrationRow
    group: str
    error: float
    band: ErrorBand
    base: float = 0.0
    novel: tuple[str, ...] = ()
    distance: float = 0.0
    unseen: bool = False

    @property
    def inside(self) -> bool:
        """Whether the error is inside the band."""
        return abs(self.error) <= self.band.points


@dataclass(frozen=True)
class Summary:
    """Coverage (share of rows inside their band), mean absolute error and median band (points)."""

    rows: int
    groups: int
    coverage: float
    mean_abs_error: float
    median_band: float


# A row set's fit and band rows, by the ids of its rows: the nested checks ask for the same sets.
Cache = dict[frozenset[str], tuple[Fitted, list[BandRow]]]


def group_check(
    rows: list[CalibrationRow],
    kind: str,
    key: Callable[[CalibrationRow], str],
    floor: float = 0.0,
    per_distance: Callable[[str], float] | None = None,
    cache: Cache | None = None,
) -> list[Checked]:
    """Each row's error when its group (`key`) is left out of the fit, with the band made from the
    other groups' rows alone (nested: their own leave-one-out errors, among themselves), widened
    for its novelties against them by `per_distance(group)` a unit of distance (None: not widened). The rows of a group
    that is every row are left out of the result (nothing to fit them from)."""
    out: dict[int, Checked] = {}
    for group in sorted({key(r) for r in rows}):
        others = [r for r in rows if key(r) != group]
        if not others:
            continue
        mine = [(i, r) for i, r in enumerate(rows) if key(r) == group]
        fitted, others_bands = _fitted(others, kind, cache)
        widening = per_distance(group) if per_distance else 0.0
        for (i, r), e in zip(mine, errors([r for _, r in mine], fitted)):
            place = place_of(r)
            base = error_band(place, others_bands, floor)
            assert base is not None  # others is not empty
            found = novelties(place, others_bands)
            band = widened(base, found, widening)
            unseen = not any(b.generation == place.generation for b in others_bands)
            out[i] = Checked(r, group, e, band, base.points, tuple(found), novelty_distance(found), unseen)
    return [out[i] for i in sorted(out)]


def _fitted(rows: list[CalibrationRow], kind: str, cache: Cache | None) -> tuple[Fitted, list[BandRow]]:
    """`rows`' fit and band rows, from `cache` where it holds them."""
    ids = frozenset(r.id for r in rows)
    if cache is not None and ids in cache:
        return cache[ids]
    made = fit(rows, kind), band_rows(rows, kind)[1]
    if cache is not None:
        cache[ids] = made
    return made


def summary(checked: list[Checked]) -> Summary:
    """The coverage, mean absolute error and median band of `checked`."""
    coverage, median = coverage_and_width([(c.error, c.band) for c in checked])
    return Summary(
        rows=len(checked),
        groups=len({c.group for c in checked}),
        coverage=coverage,
        mean_abs_error=statistics.mean(abs(c.error) for c in checked),
        median_band=median,
    )


def row_checked(rows: list[CalibrationRow], checked: list[tuple[float, ErrorBand]]) -> list[Checked]:
    """`fitting.band_check`'s row-wise result as `Checked` (each row its own group)."""
    return [Checked(r, r.id, e, b) for r, (e, b) in zip(rows, checked)]
