"""Bands checked with whole groups left out (issue 70 item 1, planner/calibration/group_check.py):
a left-out group's rows never enter their own fit or band (small synthetic rows, no compiles)."""

from __future__ import annotations

import pytest
from helpers.common import calibration_row

from tpu_tuner.planner.calibration import group_check as gc
from tpu_tuner.planner.calibration.fitting import band_rows, errors, fit, leave_one_out, place_of
from tpu_tuner.planner.calibration.rows import CalibrationRow
from tpu_tuner.planner.prediction.band import error_band

KIND = "per_generation"  # the fastest fit; the grouping logic is the same for every kind


def _row(n: int, generation: str, efficiency: float, source: str, family: str) -> CalibrationRow:
    """A compute-bound row whose published MFU is its generation's `efficiency` x 0.5, a little
    off by row so that leave-one-out errors are not 0 (its layout kind left unset)."""
    return calibration_row(n, generation, efficiency, source, family, layout="")


def _rows() -> list[CalibrationRow]:
    """Three generations: two near 0.5 efficiency, one ("odd") at 0.9, each from its own table,
    with families crossing generations."""
    rows = [_row(i, "a", 0.5, "table-a", "llama" if i % 2 else "gemma") for i in range(6)]
    rows += [_row(10 + i, "b", 0.52, "table-b", "llama" if i % 2 else "mixtral") for i in range(6)]
    rows += [_row(20 + i, "odd", 0.9, "table-odd", "gemma") for i in range(4)]
    return rows


def test_a_left_out_group_never_enters_its_own_fit_or_band(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _rows()
    seen: list[tuple[str, list[CalibrationRow]]] = []

    def spy_fit(given: list[CalibrationRow], kind: str):  # type: ignore[no-untyped-def]
        seen.append(("fit", list(given)))
        return fit(given, kind)

    def spy_band_rows(given: list[CalibrationRow], kind: str):  # type: ignore[no-untyped-def]
        seen.append(("band", list(given)))
        return band_rows(given, kind)

    monkeypatch.setattr(gc, "fit", spy_fit)
    monkeypatch.setattr(gc, "band_rows", spy_band_rows)
    for grouping, key in gc.GROUPINGS.items():
        seen.clear()
        checked = gc.group_check(rows, KIND, key)
        assert len(checked) == len(rows), grouping
        groups = sorted({key(r) for r in rows})
        assert [w for w, _ in seen] == ["fit", "band"] * len(groups)  # one fit and one band set a group
        for group, (_, fitted), (_, banded) in zip(groups, seen[::2], seen[1::2]):
            assert all(key(r) != group for r in fitted + banded), (grouping, group)
            assert len(fitted) + sum(key(r) == group for r in rows) == len(rows)  # every other row is in
        for c in checked:
            assert c.group == key(c.row)


def test_a_left_out_generation_is_predicted_and_banded_from_the_others_alone() -> None:
    rows = _rows()
    checked = gc.group_check(rows, KIND, gc.GROUPINGS["generation"])
    odd = [c for c in checked if c.row.generation == "odd"]
    others = [r for r in rows if r.generation != "odd"]
    # The odd generation's rows are predicted with the fallback of the others' efficiencies
    # (about 0.5 against its 0.9): a large miss, which a leak of its own rows would have hidden.
    expected = errors([c.row for c in odd], fit(others, KIND))
    assert [c.error for c in odd] == pytest.approx(expected)
    assert all(c.error < -15 for c in odd)
    for c in odd:
        band = error_band(place_of(c.row), band_rows(others, KIND)[1])
        assert band is not None and c.band == band
        assert any("no calibration row on odd" in reason for reason in c.band.reasons)
    # Row-wise, the same rows are fitted from their own generation's other rows: small errors.
    assert all(abs(e) < 1 for r, e in zip(rows, leave_one_out(rows, KIND)) if r.generation == "odd")


def test_summary_counts_coverage_error_and_median_band() -> None:
    rows = _rows()
    checked = gc.group_check(rows, KIND, gc.GROUPINGS["source"])
    s = gc.summary(checked)
    assert s.rows == len(rows) and s.groups == 3
    assert s.coverage == pytest.approx(sum(c.inside for c in checked) / len(rows))
    assert s.mean_abs_error == pytest.approx(sum(abs(c.error) for c in checked) / len(rows))
    widths = sorted(c.band.points for c in checked)
    assert s.median_band == pytest.approx((widths[7] + widths[8]) / 2)


def test_a_grouping_with_one_group_leaves_nothing_to_check() -> None:
    rows = [r for r in _rows() if r.generation == "a"]
    assert gc.group_check(rows, KIND, gc.GROUPINGS["generation"]) == []
