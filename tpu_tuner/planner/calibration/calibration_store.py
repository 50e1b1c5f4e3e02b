"""The adopted cost model, fitted once and kept beside the rows it was fitted to.

`benchmarks/planner/plan_calibration.py --refit` fits the adopted model (calibration.ADOPTED) to the rows it
writes and keeps the constants, with every row's leave-one-out error, its error with its
generation unseen and its error with its source or model family left out, and the band's
widening for novelty (what the bands are made of: band.py, novelty.py), in calibration_fit.json,
under the SHA-256 of the rows file. The planner reads them back instead of fitting again at each start (a leave-one-out
pass is a fit a row). A kept fit of other rows or of another model is not used: the model is
fitted again, as it was before the file existed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path
from typing import Any

from tpu_tuner.planner.calibration.fitting import (
    ADOPTED,
    OVERLAP,
    ROWS_FILE,
    CalibrationRow,
    Fitted,
    band_row,
    fit,
    leave_generation_out,
    leave_one_out,
    load_rows,
    noise_floor,
)
from tpu_tuner.planner.calibration.widening import fit_widening, widening_entries
from tpu_tuner.planner.prediction.predict import CostModel

log = logging.getLogger(__name__)

FIT_FILE = Path(__file__).with_name("calibration_fit.json")


def rows_digest(path: Path) -> str:
    """The SHA-256 of a rows file's bytes: which rows a kept fit belongs to."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fit_record(rows: list[CalibrationRow], kind: str) -> dict[str, Any]:
    """`kind` fitted to `rows`, with each row's leave-one-out error, its error with its
    generation unseen, its error with its source or family left out (the larger) and the band's
    widening for novelty, as JSON-able values."""
    fitted = asdict(fit(rows, kind))
    fitted.pop("kind")
    entries = widening_entries(rows, kind, noise_floor())
    group: dict[str, float] = {}
    for c in entries:  # each row's larger miss, left out with its source or with its family
        group[c.row.id] = max(group.get(c.row.id, 0.0), abs(c.error))
    return {
        "kind": kind,
        "fitted": fitted,
        "leave_one_out": leave_one_out(rows, kind),
        "generation_unseen": leave_generation_out(rows, kind),
        "group_unseen": [group.get(r.id) for r in rows],
        # The band's widening a unit of novelty distance (novelty.py), from the rows left out by
        # source and by model family (widening.py).
        "band_widening": fit_widening(entries),
    }


def store_fit(rows_path: Path = ROWS_FILE, fit_path: Path = FIT_FILE, kind: str = ADOPTED) -> dict[str, Any]:
    """Fit `kind` to the rows in `rows_path` and keep it in `fit_path`, under the rows' digest."""
    record = {"rows_sha256": rows_digest(rows_path), **fit_record(load_rows(rows_path), kind)}
    fit_path.write_text(json.dumps(record, indent=1) + "\n")
    return record


def stored_fit(rows_path: Path = ROWS_FILE, fit_path: Path = FIT_FILE, kind: str = ADOPTED) -> dict[str, Any] | None:
    """The fit kept in `fit_path` if it is `kind` fitted to the rows now in `rows_path`, else None."""
    try:
        record = json.loads(fit_path.read_text())
        kept_kind, kept_digest = record["kind"], record["rows_sha256"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.info("no kept calibration fit (%s): fitting the rows", exc)
        return None
    if kept_kind != kind or kept_digest != rows_digest(rows_path):
        log.info("the kept calibration fit is of other rows or another model: fitting the rows")
        return None
    return dict(record)


def cost_model_from(rows: list[CalibrationRow], record: dict[str, Any]) -> CostModel:
    """The CostModel of a fit record (`fit_record`'s) of `rows`."""
    fitted = Fitted(record["kind"], **record["fitted"])
    loo, unseen = record["leave_one_out"], record["generation_unseen"]
    group = record.get("group_unseen") or [None] * len(rows)
    bands = tuple(band_row(r, e, u, g) for r, e, u, g in zip(rows, loo, unseen, group))
    return CostModel(
        mxu_efficiency=fitted.efficiency["*"],
        memory_overlap=fitted.memory_overlap,
        overlap=OVERLAP,
        host_gbytes_per_s=fitted.host_gbytes_per_s,
        score_flops=fitted.score_flops,
        comm_exposed=fitted.comm_exposed,
        dcn_step_seconds=fitted.dcn_step_seconds,
        dropless_ratio=fitted.dropless_ratio,
        route_passes=fitted.route_passes,
        host_link_gbytes_per_s=fitted.host_link_gbytes_per_s,
        efficiency_by_generation=tuple(sorted((g, e) for g, e in fitted.efficiency.items() if g != "*")),
        loo_error_points=statistics.mean(abs(e) for e in loo),
        band_rows=bands,
        noise_floor_points=noise_floor(),
        fitted_rows=len(rows),
        band_widening=record.get("band_widening", 0.0),
    )


@lru_cache(maxsize=1)
def calibrated_cost_model() -> CostModel:
    """The `ADOPTED` efficiency model fitted to the kept calibration rows, with each row's
    leave-one-out error and place (the error band printed with every prediction, band.py): the
    kept fit where it is of these rows, else a fit made now."""
    try:
        rows = load_rows()
    except (OSError, ValueError, TypeError) as exc:
        log.warning("no calibration rows (%s): predicting with uncalibrated constants", exc)
        return CostModel()
    return cost_model_from(rows, stored_fit() or fit_record(rows, ADOPTED))
