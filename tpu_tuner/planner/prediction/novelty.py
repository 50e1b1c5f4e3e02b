"""How far a prediction is from its generation's calibration rows, and the band widened for it.

A band made of leave-one-out errors (band.py) assumes the point is like the rows it is made of.
Left out by source table or by model family (calibration/group_check.py), rows miss by more than
those bands where their generation has few other rows, where their slice is larger than any
other calibrated on it, or where their remat family or layout kind never ran on it (issue 70:
Llama 4 Scout on v5p, the v5p and v5e runs planned from outside the calibration). Each such
difference is a `NOVELTIES` kind at a distance of 1; the band of a point is multiplied by
1 + w x its count of them, w fitted from the rows
that had novelties when their group was left out (calibration/widening.py): the conformal 90%
quantile of what each needed beyond the rows without a novelty, (|error| / band / their 90%
quantile of |error| / band, at least 1, - 1) / distance. One constant: the rows that miss beyond their
band are few (Llama 4 Scout on v5p has every kind at once), too few to fit a factor per kind.
A generation without any row keeps band.py's own rule (its errors with their generation unseen).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import NamedTuple

from tpu_tuner.model.meshes.layouts import Layout
from tpu_tuner.planner.prediction.band import COVERAGE, MIN_COMPARABLE, BandRow, ErrorBand, Place, error_band

# The kinds of distance a band is widened for, in the order a reason names them.
NOVELTIES = ("few rows", "slice", "remat", "layout")


class Novelty(NamedTuple):
    """One way a point is far from its generation's rows: why, and how far (1 each kind: a
    distance graded by the rows' count, (MIN_COMPARABLE - rows) / MIN_COMPARABLE, was measured
    and dropped: a row missing 2x its band at 1/9 of a unit then asked for a 15x widening)."""

    reason: str
    distance: float


def layout_kind(layout: Layout) -> str:
    """A layout's kind: the model-parallel axes it splits over ("tensor", "context", "expert",
    joined by "+"), or "fsdp" where it splits only the batch and the parameters (data, fsdp,
    fsdp_transpose): the axes whose collectives sit on the step's critical path."""
    return "+".join(a for a in ("tensor", "context", "expert") if getattr(layout, a) > 1) or "fsdp"


def novelties(place: Place, rows: list[BandRow] | list[Place]) -> dict[str, Novelty]:
    """The `NOVELTIES` kinds in which `place` is far from its generation's rows; empty where its
    generation has no row (band.py's rule for that). Few rows: fewer than MIN_COMPARABLE, the
    fewest whose 90% quantile exists."""
    g = place.generation
    own = [r for r in rows if r.generation == g]
    if not own:
        return {}
    out = {}
    if len(own) < MIN_COMPARABLE:
        out["few rows"] = Novelty(f"only {len(own)} calibration row{'s' if len(own) > 1 else ''} on {g}", 1.0)
    sized = [r.chips for r in own if r.chips]
    if place.chips and sized and place.chips > max(sized):
        out["slice"] = Novelty(f"a slice of {place.chips} chips, larger than any calibrated on {g} ({max(sized)})", 1.0)
    if not any(r.remat_family == place.remat_family for r in own):
        out["remat"] = Novelty(f"no calibration row with {place.remat_family} remat on {g}", 1.0)
    kinds = {r.layout for r in own if r.layout}
    if place.layout and kinds and place.layout not in kinds:
        out["layout"] = Novelty(
            f"no calibration row with a {place.layout} layout on {g} (only {', '.join(sorted(kinds))})", 1.0
        )
    return out


def distance(found: Mapping[str, Novelty]) -> float:
    """How far a point is from its generation's rows: its novelties' distances, summed."""
    return sum(n.distance for n in found.values())


def widened(band: ErrorBand, found: Mapping[str, Novelty], per_distance: float) -> ErrorBand:
    """`band` x (1 + `per_distance` x the novelties' `distance`), naming them; unchanged where
    there are none. Where the fitted `per_distance` is 0 the novelties are still named (the user is
    told how far the point lies from the calibration), the width left as the rows gave it."""
    d = distance(found)
    if not d:
        return band
    named = [n.reason for n in found.values()]
    # A remat family already named as extrapolated (band.gap_kinds) is not named twice.
    reasons = band.reasons + tuple(
        f"far from the calibration: {r}" for r in named if f"extrapolated: {r}" not in band.reasons
    )
    if per_distance <= 0:
        note = (
            f"; not widened for its distance from its generation's rows ({d:.2f}): the widening "
            "fitted to the rows left out by source and model family is 0"
        )
        return replace(band, source=band.source + note, reasons=reasons)
    factor = 1 + per_distance * d
    return replace(
        band,
        points=band.points * factor,
        source=band.source
        + f"; widened x{factor:.2f} for its distance from its generation's rows ({d:.2f} x {per_distance:.2f}, "
        "fitted to the rows left out by source and model family)",
        reasons=reasons,
    )


def band_far(place: Place, rows: list[BandRow], floor: float, per_distance: float) -> ErrorBand | None:
    """band.error_band for `place`, widened for its novelties against `rows` (`widened`), its
    group-wise width (item 4 of issue 70: `ErrorBand.group_points`) said in its source."""
    band = error_band(place, rows, floor)
    if band is None:
        return None
    band = widened(band, novelties(place, rows), per_distance)
    if band.group_points is None:
        return band
    group = max(band.group_points, band.points)  # never narrower than the band it stands beside
    return replace(
        band,
        group_points=group,
        source=band.source + f"; ±{group:.1f} for a run from a source table or model family the calibration "
        f"has not seen (the {COVERAGE:.0%} quantile of the same rows' errors with their source or family left out)",
    )
