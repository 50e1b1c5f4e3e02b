"""The band's widening for novelty (prediction/novelty.py), fitted from rows left out by group.

Each row is left out with its source table, then with its model family (group_check.py); where
it then had a novelty against the rows left in (few rows of its generation, a larger slice, a
remat family or layout kind not on its generation), |error| / band says how far outside its band
it fell. The widening is what a novel row needed beyond what the rows without a novelty needed
(its generation calibrated, its band the interpolated one: the same rule, nothing new): the
conformal 90% quantile of the plain rows' |error| / band (at least 1) is the reference, and each
novel row needed (|error| / band / reference - 1) / its novelty distance. The widening is the
conformal 90% quantile of those over the rows that had novelties (band.conformal_quantile: the
largest where fewer than 9 had any), never below 0. A row that misses its band as far with no
novelty (Gemma 3 at 32k, gpt-oss: the cost model's misses, issue 70) is thus no evidence that
novelty costs more; where it is novel in a subset (a nested fold with few rows of its chip left)
it no longer sets the widening alone. A generation left out whole is not used: its rows have no
generation to be far from (band.py's own rule covers a generation without rows).
"""

from __future__ import annotations

from collections.abc import Callable

from tpu_tuner.planner.calibration.group_check import GROUPINGS, Cache, Checked, group_check
from tpu_tuner.planner.calibration.rows import CalibrationRow
from tpu_tuner.planner.prediction.band import conformal_quantile

FIT_GROUPINGS = ("source", "family")  # the groupings whose left-out rows fit the factors


def widening_entries(
    rows: list[CalibrationRow], kind: str, floor: float = 0.0, cache: Cache | None = None
) -> list[Checked]:
    """Every row left out with its source, then with its family (unwidened bands)."""
    return [c for g in FIT_GROUPINGS for c in group_check(rows, kind, GROUPINGS[g], floor, cache=cache)]


def fit_widening(entries: list[Checked]) -> float:
    """The band's widening a unit of novelty distance (novelty.widened): the conformal 90%
    quantile, over the entries with novelties, of (|error| / band / reference - 1) / distance (a
    ratio inside the reference counts as 0), where the reference is the conformal 90% quantile of
    |error| / band over the plain entries (no novelty, their generation calibrated), at least 1
    (1 where there are none); 0 where no entry had a novelty."""
    plain = [abs(c.error) / c.base for c in entries if not c.distance and not c.unseen and c.base > 0]
    reference = max(1.0, conformal_quantile(plain)) if plain else 1.0
    needed = [
        max(0.0, abs(c.error) / c.base / reference - 1) / c.distance for c in entries if c.distance > 0 and c.base > 0
    ]
    return conformal_quantile(needed) if needed else 0.0


def nested_factors(
    rows: list[CalibrationRow],
    kind: str,
    key: Callable[[CalibrationRow], str],
    floor: float = 0.0,
    cache: Cache | None = None,
) -> Callable[[str], float]:
    """For group_check's `per_distance`: a left-out group's widening fitted from the other groups'
    rows alone (their own entries, each left out by source and family among themselves), so no
    row of the group sets its own widening."""

    def factors(group: str) -> float:
        others = [r for r in rows if key(r) != group]
        return fit_widening(widening_entries(others, kind, floor, cache))

    return factors


def row_factors(entries: list[Checked]) -> Callable[[CalibrationRow], float]:
    """For fitting.band_check's `per_distance`: a row's widening fitted from the other rows'
    entries (`entries` of every row; the row's own left out, though it stayed in the others' fits)."""
    return lambda row: fit_widening([c for c in entries if c.row.id != row.id])
