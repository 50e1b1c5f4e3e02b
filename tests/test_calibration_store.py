"""The adopted cost model's fit, kept beside the rows it was fitted to and read back by the planner."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from tpu_tuner.planner.calibration import calibration_store
from tpu_tuner.planner.calibration.calibration_store import (
    cost_model_from,
    fit_record,
    rows_digest,
    store_fit,
    stored_fit,
)
from tpu_tuner.planner.calibration.fitting import ADOPTED, ROWS_FILE, load_rows


# Slow: the refit with the route term's grid and the nested band checks took 39 s of one core in
# the quick run (2026-12-07), a tenth of it; CI runs it with the slow tests.
@pytest.mark.slow
def test_the_shipped_fit_is_the_adopted_models_fit_of_the_shipped_rows() -> None:
    """--refit keeps them together: the kept record is of these rows and this model, and a fit
    made now gives the same constants and errors (else the planner would predict with stale ones)."""
    kept = stored_fit()
    assert kept is not None, "calibration_fit.json is not the adopted fit of calibration_rows.json: run --refit"
    assert kept["rows_sha256"] == rows_digest(ROWS_FILE) and kept["kind"] == ADOPTED
    fresh = fit_record(load_rows(), ADOPTED)
    assert kept["fitted"] == fresh["fitted"]
    assert kept["leave_one_out"] == pytest.approx(fresh["leave_one_out"], abs=1e-9)
    unseen = [(u is None, u or 0.0) for u in kept["generation_unseen"]]
    assert unseen == [(u is None, pytest.approx(u or 0.0, abs=1e-9)) for u in fresh["generation_unseen"]]


def test_the_planner_reads_the_kept_fit_without_fitting(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_fitting(*args: object) -> None:
        raise AssertionError("fitted again although the kept fit is of these rows")

    monkeypatch.setattr(calibration_store, "fit_record", no_fitting)
    model = calibration_store.calibrated_cost_model.__wrapped__()
    assert model.fitted_rows == len(load_rows()) and model.dcn_step_seconds > 0 and model.route_passes > 0


def test_a_kept_fit_of_other_rows_or_another_model_is_not_used(tmp_path: Path) -> None:
    rows = load_rows()[:8]
    rows_file, fit_file = tmp_path / "rows.json", tmp_path / "fit.json"
    rows_file.write_text(json.dumps([asdict(r) for r in rows]))
    kept = store_fit(rows_file, fit_file, "per_generation")
    assert stored_fit(rows_file, fit_file, "per_generation") == kept
    assert stored_fit(rows_file, fit_file, "per_generation+dcn") is None  # another model
    model = cost_model_from(rows, kept)
    assert model.fitted_rows == 8 and len(model.band_rows) == 8
    rows_file.write_text(json.dumps([asdict(r) for r in rows[:7]]))  # the rows changed under it
    assert stored_fit(rows_file, fit_file, "per_generation") is None
    fit_file.write_text("{not json")
    assert stored_fit(rows_file, fit_file, "per_generation") is None
