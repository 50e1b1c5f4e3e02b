"""A TPU generation without calibration rows takes the efficiency of the line through the other
generations' fitted efficiencies in the log of their published bf16 peaks (issue 70)."""

from __future__ import annotations

import math

import pytest

from tpu_tuner.core.hardware import TPU_CHIPS
from tpu_tuner.planner.calibration.fitting import CalibrationRow, fit, leave_generation_out, predicted_mfu
from tpu_tuner.planner.prediction.efficiency_prior import HIGHEST, LOWEST, efficiency_prior
from tpu_tuner.planner.prediction.predict import CostModel


def _line_at(points: dict[str, float], generation: str) -> float:
    """The least-squares line of `points` in ln(peak per chip), at `generation`: written out apart
    from the module, from the published peaks in core/hardware.py."""
    xs = {g: math.log(TPU_CHIPS[g].bf16_tflops_per_chip) for g in [*points, generation]}
    mean_x = sum(xs[g] for g in points) / len(points)
    mean_e = sum(points.values()) / len(points)
    slope = sum((xs[g] - mean_x) * (e - mean_e) for g, e in points.items()) / sum((xs[g] - mean_x) ** 2 for g in points)
    return mean_e + slope * (xs[generation] - mean_x)


# The shape of the fitted efficiencies (docs/planner.md, issue 70): lower on the faster chips.
DENSE = {"v4": 0.70, "v5e": 0.78, "v5p": 0.74, "v6e": 0.70}


def test_an_unseen_generation_follows_the_line_in_its_peak_not_the_median_chip() -> None:
    prior = efficiency_prior(DENSE, "tpu7x")
    assert prior == pytest.approx(_line_at(DENSE, "tpu7x"))
    # TPU7x's peak (2307 TFLOP/s a chip) is past every other chip's, where the line is lowest:
    # below the median chip's 0.72 and below each calibrated chip's efficiency.
    assert prior is not None and prior < min(DENSE.values())
    # The generation's own efficiency never enters its prior.
    assert efficiency_prior({**DENSE, "tpu7x": 0.99}, "tpu7x") == pytest.approx(prior)


def test_no_line_without_two_known_peaks_or_an_unknown_chip() -> None:
    assert efficiency_prior({"v5p": 0.74}, "tpu7x") is None
    assert efficiency_prior(DENSE, "v9z") is None
    assert efficiency_prior({"v4": 0.7, "mystery": 0.9}, "v6e") is None


def test_the_prior_stays_within_its_bounds() -> None:
    steep = {"v5e": 0.95, "v5p": 0.25}  # a line that would fall below zero at TPU7x's peak
    assert efficiency_prior(steep, "tpu7x") == LOWEST
    assert efficiency_prior({"v5p": 0.9, "v6e": 0.5}, "v5e") == HIGHEST


def _row(number: int, generation: str, efficiency: float) -> CalibrationRow:
    row = CalibrationRow(number, generation, True, 1.0, 2.0, 4.0, 1.0, 0.01, 2.4, 0.0)
    return CalibrationRow(**{**row.__dict__, "published_mfu": predicted_mfu(row, efficiency, 0.4)})


def test_the_fit_and_the_planner_give_an_unseen_generation_the_same_prior() -> None:
    rows = [_row(n, g, e) for n, (g, e) in enumerate(DENSE.items())]
    fitted = fit(rows, "per_generation")
    expected = _line_at({g: fitted.efficiency_of(g) for g in DENSE}, "tpu7x")
    assert fitted.efficiency_of("tpu7x") == pytest.approx(expected)
    assert fitted.efficiency["*"] == pytest.approx(0.72)  # the median chip's, kept for a chip without a peak
    assert fitted.efficiency_of("tpu7x") != pytest.approx(fitted.efficiency["*"])
    model = CostModel(
        mxu_efficiency=fitted.efficiency["*"],
        efficiency_by_generation=tuple((g, e) for g, e in fitted.efficiency.items() if g != "*"),
        dropless_ratio=0.5,
    )
    assert model.efficiency("tpu7x") == pytest.approx(expected)
    assert model.efficiency("tpu7x", "dropless") == pytest.approx(expected * 0.5)


def test_leaving_a_generation_out_predicts_it_from_the_others_line_alone() -> None:
    rows = [_row(n, g, e) for n, (g, e) in enumerate(DENSE.items())]
    unseen = leave_generation_out(rows, "per_generation")
    for row, error in zip(rows, unseen):
        others = fit([r for r in rows if r is not row], "per_generation")
        line = _line_at({g: others.efficiency_of(g) for g in DENSE if g != row.generation}, row.generation)
        expected = (predicted_mfu(row, line, others.memory_overlap) - row.published_mfu) * 100
        assert error == pytest.approx(expected), row.generation
