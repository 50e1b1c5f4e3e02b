"""The error band (planner/prediction/band.py): a quantile of comparable rows' misses, wider with distance."""

from __future__ import annotations

import random

import pytest

from tpu_tuner.planner.prediction.band import (
    MIN_COMPARABLE,
    BandRow,
    Place,
    comparable,
    conformal_quantile,
    error_band,
    gaps,
)


def _rows() -> list[BandRow]:
    rng = random.Random(0)
    rows = [BandRow("v6e", "offload", 8192, rng.choice([2, 3, 4, 5]), rng.gauss(0, 2)) for _ in range(10)]
    rows += [
        BandRow("v5p", "minimal", 2048, 8, 1.5),
        BandRow("v5p", "minimal", 2048, 2, -2.5),
        BandRow("v5e", "full", 2048, 6, -7.0),
        BandRow("v6e", "full", 4096, 8, 4.0),
    ]
    return rows


def test_conformal_quantile_is_the_order_statistic_that_covers_ninety_percent() -> None:
    values = [float(v) for v in range(1, 20)]  # 19 values: the ceil(0.9 x 20) = 18th smallest
    assert conformal_quantile(values) == 18.0
    assert conformal_quantile([1.0, 5.0, 2.0]) == 5.0  # fewer than 9: the largest
    with pytest.raises(ValueError):
        conformal_quantile([])


def test_comparable_rows_are_the_nearest_nine_with_unlike_ones_filling_in() -> None:
    assert MIN_COMPARABLE == 9  # the fewest rows whose conformal 90% quantile is one of them
    rows = _rows()
    same, which = comparable(Place("v6e", "offload", 8192, 4), rows)
    # The lone v5e row's error was an extrapolation (no other v5e row in its fit): left out, said so.
    assert len(same) == 10 and which.startswith("the 10 rows most like it (10 alike; left out: 1 extrapolated error")
    # No row alike: the nearest fill the set (the v6e offload rows: another remat only), said so.
    device, which = comparable(Place("v6e", "device", 8192, 4), rows)
    assert len(device) >= MIN_COMPARABLE and all(r.generation == "v6e" for r in device)
    assert which.startswith(f"the {len(device)} rows most like it (0 alike; the others unlike it in remat")
    assert len(comparable(Place("v5p", "minimal", 2048, 4), rows[-4:])[0]) == 4  # fewer rows: all of them


def test_gaps_name_what_has_no_nearby_row() -> None:
    rows = _rows()
    assert gaps(Place("v6e", "offload", 8192, 4), rows) == []
    assert gaps(Place("v6e", "full", 4096, 8), rows) == []
    assert gaps(Place("v6e", "minimal", 32768, 0.5), rows) == [
        "no calibration row with minimal remat on v6e",
        "no calibration row on v6e within 2x of sequence 32768",
        "no calibration row on v6e within 2x of per-device batch 0.5",
    ]
    assert gaps(Place("v4", "full", 2048, 16), rows)[0] == "no calibration row on v4"


def test_band_covers_comparable_rows_and_widens_with_distance() -> None:
    rows = _rows()
    inside = error_band(Place("v6e", "offload", 8192, 4), rows)
    offload = sorted(abs(r.error) for r in rows[:10])
    assert inside.points == offload[-1] and inside.reasons == ()  # 10 rows: the ceil(0.9 x 11) = 10th
    far = error_band(Place("v6e", "device", 65536, 64), rows)
    assert far.points > inside.points
    assert "extrapolated: no calibration row with device remat on v6e" in far.reasons and len(far.reasons) == 3
    unseen = error_band(Place("v4", "full", 2048, 16), rows)
    assert unseen.reasons[0] == "extrapolated: no calibration row on v4" and unseen.points >= 7.0
    assert error_band(Place("v6e", "offload", 8192, 4), []) is None


def test_an_unseen_generation_takes_the_quantile_of_the_errors_with_generations_left_out() -> None:
    unseen = (1.0, -2.0, 3.0, 9.0, -1.0, 2.0, 0.5, 1.5, 2.5)
    rows = [BandRow("v6e", "offload", 8192, 4, 0.5, u) for u in unseen]
    rows += [BandRow("v5p", "offload", 8192, 4, -0.5, -4.0)]
    band = error_band(Place("v5e", "offload", 8192, 4), rows)
    assert band.points == 9.0  # 10 errors: the ceil(0.9 x 11) = 10th smallest
    # Fewer than MIN_COMPARABLE such errors cannot promise the coverage: the assumed rule instead.
    assert error_band(Place("v5e", "offload", 8192, 4), rows[-4:]).points == pytest.approx(0.5 * 1.25)
    assert "generation was left out" in band.source
    # A further gap (a sequence no row is near) widens it by WIDEN, assumed and said so.
    far = error_band(Place("v5e", "offload", 65536, 4), rows)
    assert far.points == pytest.approx(9.0 * 1.25) and "per further gap" in far.source
    # Without such errors, the assumed rule: the largest leave-one-out error x 1.25.
    plain = [BandRow(r.generation, r.remat_family, r.seq, r.per_device_batch, r.error) for r in rows]
    assert error_band(Place("v5e", "offload", 8192, 4), plain).points == pytest.approx(0.5 * 1.25)


def test_an_unseen_generation_takes_the_unseen_errors_of_the_rows_most_like_it() -> None:
    # Dense rows that missed by a few points with their generation left out, and dropless MoE rows
    # that missed by 11-14: a dense point of a generation without rows is like the dense rows.
    dense = [BandRow("v6e", "full", 8192, 4, 0.5, u, moe="dense") for u in (1, -2, 1.5, 0.5, -1, 2, 2.5, -1.5, 3)]
    dropless = [BandRow("tpu7x", "full", 8192, 4, 1.0, u, moe="dropless") for u in (12.0, -14.0, 11.0)]
    rows = dense + dropless
    band = error_band(Place("v5p", "full", 8192, 4, moe="dense"), rows)
    # The 9 dense rows' unseen errors (their largest), not the 12 rows' 90% quantile (14, the old rule).
    assert band is not None and band.points == 3.0
    assert "rows most like it (generation not compared)" in band.source
    # A dropless point: 3 rows of its kind cannot give a 90% quantile: every row's (the 12th smallest).
    moe = error_band(Place("v5p", "full", 8192, 4, moe="dropless"), rows)
    assert moe is not None and moe.points == 14.0 and "every row (12: 3 of its MoE kind, dropless)" in moe.source
    # Over two slices, with no multi-slice row to fit the DCN step: predicted with a second fallback, every row.
    slices = error_band(Place("v5p", "full", 8192, 4, moe="dense", slices=2), rows)
    assert slices is not None and slices.points == 14.0 and "no row fits its dcn term either" in slices.source
