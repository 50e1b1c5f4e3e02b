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

from tpu_tuner.planner.calibration.fitting import band_rows, errors, fit, place_of
from tpu_tuner.planner.calibration.rows import CalibrationRow
from tpu_tuner.planner.prediction.band import ErrorBand, coverage_and_width, error_band

# What a row is grouped by: its chip, its published table or log, its model family.
GROUPINGS: dict[str, Callable[[CalibrationRow], str]] = {
    "generation": lambda r: r.generation,
    "source": lambda r: r.source,
    "family": lambda r: r.family,
}


@dataclass(frozen=True)
class Checked:
    """One row's error with its group left out of the fit, and the band it would have had."""

    row: CalibrationRow
    group: str
    error: float
    band: ErrorBand

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


def group_check(
    rows: list[CalibrationRow], kind: str, key: Callable[[CalibrationRow], str], floor: float = 0.0
) -> list[Checked]:
    """Each row's error when its group (`key`) is left out of the fit, with the band made from the
    other groups' rows alone (nested: their own leave-one-out errors, among themselves). The rows
    of a group that is every row are left out of the result (nothing to fit them from)."""
    out: dict[int, Checked] = {}
    for group in sorted({key(r) for r in rows}):
        others = [r for r in rows if key(r) != group]
        if not others:
            continue
        mine = [(i, r) for i, r in enumerate(rows) if key(r) == group]
        fitted = fit(others, kind)
        _, others_bands = band_rows(others, kind)
        for (i, r), e in zip(mine, errors([r for _, r in mine], fitted)):
            band = error_band(place_of(r), others_bands, floor)
            assert band is not None  # others is not empty
            out[i] = Checked(r, group, e, band)
    return [out[i] for i in sorted(out)]


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
