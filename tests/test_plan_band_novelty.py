"""Bands that know what they have not seen (issue 70 item 2): a point far from its generation's
rows (few of them, a larger slice, a remat family or layout kind never calibrated there) gets a
band widened by a factor fitted from rows left out by group, and names why (prediction/novelty.py,
calibration/widening.py; small synthetic rows, no compiles)."""

from __future__ import annotations

from dataclasses import asdict, replace

import pytest
from helpers.common import calibration_row

from tpu_tuner.model.meshes.layouts import Layout
from tpu_tuner.planner.calibration import widening
from tpu_tuner.planner.calibration.group_check import GROUPINGS, Checked, group_check
from tpu_tuner.planner.calibration.rows import CalibrationRow
from tpu_tuner.planner.prediction.band import MIN_COMPARABLE, BandRow, ErrorBand, Place, error_band
from tpu_tuner.planner.prediction.novelty import band_far, distance, layout_kind, novelties
from tpu_tuner.planner.prediction.predict import CostModel
from tpu_tuner.planner.prediction.predict import error_band as planned_band


def _band_rows() -> list[BandRow]:
    """Twelve v6e rows (offload, fsdp, up to 256 chips) and three v5p rows (minimal, tensor, 128)."""
    v6e = [
        BandRow("v6e", "offload", 8192, 4, e, chips=c, layout="fsdp")
        for e, c in zip(
            (0.5, -1.0, 1.5, -2.0, 0.2, 1.1, -0.7, 1.9, -1.4, 0.9, -0.3, 1.2), [8, 16, 32, 64, 128, 256] * 2
        )
    ]
    v5p = [BandRow("v5p", "minimal", 2048, 4, e, chips=128, layout="tensor") for e in (1.0, -2.0, 1.5)]
    return v6e + v5p


def test_layout_kind_names_the_model_parallel_axes() -> None:
    assert layout_kind(Layout(1, 64, 1)) == "fsdp"
    assert layout_kind(Layout(4, 32, 1, fsdp_transpose=2)) == "fsdp"
    assert layout_kind(Layout(1, 32, 16)) == "tensor"
    assert layout_kind(Layout(1, 64, 1, 8)) == "context"
    assert layout_kind(Layout(1, 16, 4, expert=4)) == "tensor+expert"


def test_each_novelty_is_found_against_its_generation_only() -> None:
    rows = _band_rows()
    # A v6e point like its twelve rows: nothing new.
    assert novelties(Place("v6e", "offload", 8192, 4, chips=256, layout="fsdp"), rows) == {}
    # A v5p point on 512 chips, full remat, fsdp: every kind at once; three rows are few.
    found = novelties(Place("v5p", "full", 2048, 4, chips=512, layout="fsdp"), rows)
    assert list(found) == ["few rows", "slice", "remat", "layout"]
    assert found["few rows"].distance == 1.0 and 3 < MIN_COMPARABLE
    assert "only 3 calibration rows on v5p" == found["few rows"].reason
    assert "512 chips, larger than any calibrated on v5p (128)" in found["slice"].reason
    assert "fsdp layout on v5p (only tensor)" in found["layout"].reason
    assert distance(found) == 4.0
    # v6e's rows hold fsdp only, yet a v6e tensor layout is new there, as a larger slice would be.
    assert list(novelties(Place("v6e", "offload", 8192, 4, chips=512, layout="tensor"), rows)) == ["slice", "layout"]
    # A generation without rows: band.py's own rule, no novelty here.
    assert novelties(Place("v4", "full", 2048, 4, chips=64, layout="fsdp"), rows) == {}
    # Unstated chips or layout are not compared.
    assert list(novelties(Place("v5p", "minimal", 2048, 4), rows)) == ["few rows"]


def test_the_band_widens_with_distance_and_names_why() -> None:
    rows = _band_rows()
    place = Place("v5p", "full", 2048, 4, chips=512, layout="fsdp")
    base = error_band(place, rows)
    assert base is not None
    far = band_far(place, rows, 0.0, 0.5)
    assert far is not None
    assert far.points == pytest.approx(base.points * (1 + 0.5 * 4))
    said = [r for r in far.reasons if r.startswith("far from the calibration: ")]
    assert len(said) == 3  # few rows, slice, layout; remat is already named as extrapolated
    assert "extrapolated: no calibration row with full remat on v5p" in far.reasons
    assert "widened x" in far.source
    # No widening constant: the band's width as band.py makes it, its novelties still named.
    unwidened = band_far(place, rows, 0.0, 0.0)
    assert unwidened is not None and unwidened.points == base.points
    assert [r for r in unwidened.reasons if r.startswith("far from the calibration: ")] == said
    assert "not widened" in unwidened.source
    # No novelty: the band as band.py makes it.
    near = Place("v6e", "offload", 8192, 4, chips=64, layout="fsdp")
    assert band_far(near, rows, 0.0, 0.5) == error_band(near, rows)


def test_the_planner_band_takes_the_cost_models_widening() -> None:
    rows = tuple(_band_rows())
    place = Place("v5p", "minimal", 2048, 4, chips=1024, layout="tensor")
    plain = planned_band(place, CostModel(band_rows=rows, fitted_rows=len(rows)))
    wide = planned_band(place, CostModel(band_rows=rows, fitted_rows=len(rows), band_widening=0.4))
    assert plain is not None and wide is not None
    assert wide.points == pytest.approx(plain.points * (1 + 0.4 * 2))  # few rows, slice


def _checked(error: float, base: float, d: float, unseen: bool = False) -> Checked:
    row = CalibrationRow(0, "v5p", True, 0, 0, 1, 0, 0, 1, 0.5, id=f"r{error}{base}{d}")
    return Checked(row, "g", error, ErrorBand(base, ""), base, ("few rows",) if d else (), d, unseen)


def test_the_widening_is_the_quantile_of_what_each_novel_row_needed_per_distance() -> None:
    # Rows inside their band need nothing; a row 3x outside at distance 2 needs 1.0 a unit.
    entries = [_checked(1.0, 2.0, 1.0), _checked(6.0, 2.0, 2.0)]
    assert widening.fit_widening(entries) == pytest.approx(1.0)  # under 9 entries: the largest
    assert widening.fit_widening([_checked(9.0, 1.0, 0.0)]) == 0.0  # no novelty: no widening
    needed = [_checked(2.0 + i, 2.0, 1.0) for i in range(19)]  # (|e| / 2 - 1): 0, 0.5, ... 9.0
    assert widening.fit_widening(needed) == pytest.approx(8.5)  # the ceil(0.9 x 20) = 18th of 19
    # Plain rows inside their bands leave the reference at 1: the same widening.
    assert widening.fit_widening(entries + [_checked(1.0, 2.0, 0.0)] * 9) == pytest.approx(1.0)


def test_the_widening_is_what_novel_rows_needed_beyond_the_plain_rows() -> None:
    # Plain rows (no novelty, their generation calibrated) that miss their bands by up to 2x: a
    # novel row 3x outside at distance 1 needed 3 / 2 - 1 = 0.5 a unit beyond them, not 2.
    plain = [_checked(1.0 + 0.1 * i, 1.0, 0.0) for i in range(9)] + [_checked(2.0, 1.0, 0.0)]
    assert widening.fit_widening(plain + [_checked(3.0, 1.0, 1.0)]) == pytest.approx(0.5)
    # As far outside as the plain rows: no widening (the cost model's miss, not the novelty's).
    assert widening.fit_widening(plain + [_checked(2.0, 1.0, 1.0)]) == 0.0
    # Rows of a generation without rows (band.py's own rule) are no reference.
    unseen = [_checked(5.0, 1.0, 0.0, unseen=True)] * 10
    assert widening.fit_widening(unseen + [_checked(3.0, 1.0, 1.0)]) == pytest.approx(2.0)


def test_a_rows_band_made_without_its_generation_is_marked_unseen() -> None:
    rows = [_row(i, "a", 0.5, f"a{i % 3}", 64) for i in range(9)]
    rows += [_row(10 + i, "b", 0.6, "b", 64) for i in range(3)]
    checked = group_check(rows, "per_generation", GROUPINGS["source"])
    assert {c.row.generation for c in checked if c.unseen} == {"b"}  # source "b" is all of b
    assert not any(c.unseen for c in checked if c.row.generation == "a")


def _row(n: int, generation: str, efficiency: float, source: str, chips: int) -> CalibrationRow:
    return calibration_row(n, generation, efficiency, source, chips=chips, jitter=0.004)


def test_a_left_out_groups_widening_is_fitted_without_its_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [_row(i, "a", 0.5, f"a{i % 3}", 64) for i in range(9)]
    rows += [_row(10 + i, "b", 0.6, "b", 64 * (i + 1)) for i in range(3)]
    seen: list[list[CalibrationRow]] = []
    real = widening.widening_entries

    def spy(given: list[CalibrationRow], *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(list(given))
        return real(given, *args, **kwargs)

    monkeypatch.setattr(widening, "widening_entries", spy)
    key = GROUPINGS["source"]
    checked = group_check(
        rows, "per_generation", key, per_distance=widening.nested_factors(rows, "per_generation", key)
    )
    groups = sorted({key(r) for r in rows})
    assert len(seen) == len(groups) and len(checked) == len(rows)
    for group, given in zip(groups, seen):
        assert given and all(key(r) != group for r in given)
    # The b rows left out with their source: no b row is left, so no novelty (the generation rule).
    assert all(c.novel == () for c in checked if c.row.generation == "b")
    # An a row left out by its source still has six a rows: few, so its band may widen; never narrows.
    assert all(c.band.points >= c.base for c in checked)
    assert all("few rows" in c.novel for c in checked if c.row.generation == "a")


def test_the_band_carries_the_group_wise_width_of_its_rows() -> None:
    # Item 4: the rows' errors with their source or family left out give the band a second width.
    rows = [replace(r, group_error=3 * r.error) for r in _band_rows()]
    place = Place("v6e", "offload", 8192, 4, chips=64, layout="fsdp")
    band = error_band(place, rows)
    assert band is not None and band.group_points is not None
    near = [r for r in rows if r.generation == "v6e"]
    assert band.group_points == pytest.approx(max(band.points, max(abs(r.group_error or 0) for r in near)))
    said = band_far(place, rows, 0.0, 0.5)  # the planner's band says it (no novelty here: the same figures)
    assert said is not None and said.points == band.points and said.group_points == band.group_points
    assert f"±{band.group_points:.1f} for a run from a source table or model family" in said.source
    assert asdict(band)["group_points"] == band.group_points  # plan.json's bands are their asdict
    # Widened for novelty, the group-wise width is never the narrower of the two.
    far = band_far(Place("v5p", "full", 2048, 4, chips=512, layout="fsdp"), rows, 0.0, 0.5)
    assert far is not None and far.group_points is not None and far.group_points >= far.points
    assert f"±{far.group_points:.1f} for a run" in far.source
    # Rows without group-wise errors (an older fit): no second width.
    plain = error_band(place, _band_rows())
    assert plain is not None and plain.group_points is None


def test_the_shipped_fit_gives_every_row_a_group_wise_error() -> None:
    from tpu_tuner.planner.calibration.calibration_store import cost_model_from, stored_fit
    from tpu_tuner.planner.calibration.fitting import load_rows

    record = stored_fit()
    assert record is not None, "calibration_fit.json is not the adopted fit of the shipped rows"
    model = cost_model_from(load_rows(), record)
    assert model.band_widening >= 0  # 0 since the route term (issue 70): novelties named, not widened
    assert all(r.group_error is not None for r in model.band_rows)
    band = planned_band(Place("v6e", "offload", 8192, 4, moe="dense", slices=1, chips=256, layout="fsdp"), model)
    assert band is not None and band.group_points is not None and band.group_points >= band.points
