"""The "+route" term (issue 70 item 3): a dropless MoE step's matmuls at its generation's dense
efficiency, plus fitted HBM passes over its routed tokens, so a generation without dropless rows
is predicted from the passes fitted on another's (docs/planner.md, "Calibration")."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tpu_tuner.planner.calibration.fitting import CalibrationRow, errors, fit, predicted_mfu
from tpu_tuner.planner.prediction.predict import CostModel, routed_seconds


def _row(number: int, generation: str, compute: float, route: float = 0.0) -> CalibrationRow:
    row = CalibrationRow(number, generation, True, 1.0, 2.0, compute, 1.0, 0.01, 0.6 * compute, 0.0)
    return replace(row, moe="dropless" if route else "dense", route_seconds=route)


def _published(row: CalibrationRow, efficiency: float, passes: float) -> CalibrationRow:
    """The row with the MFU that `efficiency` and `passes` give it (memory overlap 0.4)."""
    return replace(row, published_mfu=predicted_mfu(row, efficiency, 0.4, route_passes=passes))


def test_the_route_fit_recovers_the_passes_and_carries_them_to_a_chip_without_dropless_rows() -> None:
    """Rows made with dense efficiencies per chip and 50 passes: the fit finds them, dropless rows
    in their generation's efficiency group, and a chip's lone dropless row left out is predicted."""
    made = [_row(1, "v5p", 5.0), _row(2, "v5p", 3.0), _row(3, "v5p", 4.0, 0.02), _row(4, "v5p", 2.0, 0.05)]
    made += [_row(5, "v6e", 4.0), _row(6, "v6e", 2.0), _row(7, "v6e", 3.0, 0.03)]
    truth = {"v5p": 0.8, "v6e": 0.6}
    rows = [_published(r, truth[r.generation], 50.0) for r in made]
    fitted = fit(rows, "per_generation+route")
    assert fitted.route_passes == pytest.approx(50.0, rel=0.3)
    assert fitted.efficiency_of("v5p", "dropless") == fitted.efficiency_of("v5p") == pytest.approx(0.8)
    assert "v5p/dropless" not in fitted.efficiency  # dropless steps share their generation's efficiency
    assert max(abs(e) for e in errors(rows, fitted)) < 0.5
    # Left out, v6e's dropless row takes v5p's passes and v6e's dense efficiency from its own rows.
    held = fit([r for r in rows if r.number != 7], "per_generation+route")
    assert abs(errors([rows[6]], held)[0]) < 0.5


def test_the_planner_charges_the_route_passes_as_the_fit_does() -> None:
    """CostModel with route passes keeps a dropless step at the dense efficiency; the seconds one
    pass costs are predict.routed_seconds, the figure plan_calibration.py keeps per row."""
    model = CostModel(efficiency_by_generation=(("v5p", 0.72),), route_passes=90.0, dropless_ratio=0.5)
    assert model.efficiency("v5p", "dropless") == model.efficiency("v5p") == 0.72
    assert (
        CostModel(efficiency_by_generation=(("v5p", 0.72),), dropless_ratio=0.5).efficiency("v5p", "dropless") == 0.36
    )
    # Llama 4 Scout on v5p: 8 x 8192 tokens a device, top-1 of d_model 5120 in 48 routed layers.
    assert routed_seconds(8 * 8192, 1 * 5120 * 48, 2765e9) == pytest.approx(0.01165, rel=1e-3)
