"""Read every run folder under a results folder into one pandas table (one row per folder).

A run folder is recognised by the file its command writes last or first:

* ``ranking.json``       -> ``ranking``  (``tpu-tune plan --topology A,B,...``; its plan folders, one a
  slice, are read too, as plans named ``<ranking folder>/<plan folder>``)
* ``plan.json``          -> ``plan``     (``tpu-tune plan``)
* ``buckets.json``       -> ``buckets``  (``tpu-tune buckets``)
* ``run.json`` or ``tuned_config.toml`` -> ``tune`` (``tpu-tune MODEL.py``; ``run.json`` is written
  when the study starts, ``tuned_config.toml`` when the run ends)
* ``profile.json``       -> ``profile``  (``tpu-tune profile``)

Nothing here raises for a bad folder: a folder that cannot be read becomes a row with status
``unreadable`` and the reason, so that one corrupt run never hides the others.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pandas as pd

from tpu_tuner.core.credentials import redact
from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.run_folder import (
    BUCKETS_JSON,
    PLAN_JSON,
    PROFILE_JSON,
    PROFILE_MD,
    REPORT_MD,
    RUN_JSON,
    TRIALS_CSV,
    TUNED_CONFIG,
)
from tpu_tuner.dashboard.collection import Collection
from tpu_tuner.dashboard.contributions import read_contributions
from tpu_tuner.dashboard.device_labels import peak_basis
from tpu_tuner.dashboard.folder_files import (
    LIVE_WINDOW_S,
    base_row,
    date_of,
    load_json,
    load_toml,
    nested,
    reason_of,
    report_link,
)
from tpu_tuner.dashboard.planner_folders import ranking_plans, read_buckets, read_plan, read_ranking
from tpu_tuner.knobs import registry as knobs
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.planner.plans.ranking import RANKING_JSON
from tpu_tuner.studies import records, run_file
from tpu_tuner.studies.outcome import Outcome

log = logging.getLogger(__name__)

# Columns of the runs table, in order; the --csv export writes exactly these.
COLUMNS = [
    "run",
    "kind",
    "status",
    "reason",
    "model",
    "device",
    "device_name",
    "date",
    "started",
    "mfu",
    "baseline_mfu",
    "tuned_mfu",
    "peak_dtype",
    "speedup",
    "speedup_ci_low",
    "speedup_ci_high",
    "significant",
    "accuracy_error",
    "trials",
    "failures",
    "step_s",
    "baseline_step_s",
    "settings",
    "achieved_flops_per_s",
    "peak_flops_per_s",
    "peak_basis",
    "peak_source",
    "peak_bytes_per_s",
    "arithmetic_intensity",
    "topology",
    "chips",
    "report",
    "path",
]
# The knobs a tuning run's trials.csv may hold (TRIAL_COLUMNS in tuning/run/tuning_result.py).
KNOBS = knobs.names()


def collect(root: str | Path) -> Collection:
    """Read every run folder directly under `root`. Raises UserInputError if `root` is no folder."""
    root = Path(root)
    if not root.exists():
        raise UserInputError("no such results folder", root)
    if not root.is_dir():
        raise UserInputError("not a folder (give the results folder that holds the run folders)", root)
    collection = Collection(root=root, runs=pd.DataFrame(columns=COLUMNS))
    rows = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        try:
            row = _read_folder(folder, collection)
        except Exception as exc:
            log.warning("unreadable run folder %s: %s", folder, reason_of(exc))
            row = base_row(folder, _kind_of(folder) or "unknown")
            row.update(status="unreadable", reason=reason_of(exc))
        if row is not None:
            rows.append(row)
        if row is not None and row["kind"] == "ranking":
            rows += ranking_plans(folder, collection)
    if rows:
        frame = pd.DataFrame(rows).reindex(columns=COLUMNS)
        for column in ("date", "started"):
            frame[column] = pd.to_datetime(frame[column], utc=True, errors="coerce")
        collection.runs = frame.sort_values("date", ascending=False, na_position="last", kind="stable")
        collection.runs = collection.runs.reset_index(drop=True)
    return collection


def write_csv(collection: Collection, path: str | Path) -> Path:
    """Write the runs table (every folder, unreadable ones included, with the reason) as CSV."""
    path = Path(path)
    try:
        collection.runs.to_csv(path, index=False)
    except OSError as exc:
        raise UserInputError(f"cannot write the CSV: {exc.strerror or exc}", path) from exc
    return path


def _kind_of(folder: Path) -> str | None:
    for name, kind in (
        (RANKING_JSON, "ranking"),
        (PLAN_JSON, "plan"),
        (BUCKETS_JSON, "buckets"),
        (RUN_JSON, "tune"),
        (TUNED_CONFIG, "tune"),
        (PROFILE_JSON, "profile"),
    ):
        if (folder / name).exists():
            return kind
    return None


def _read_folder(folder: Path, collection: Collection) -> dict[str, Any] | None:
    kind = _kind_of(folder)
    if kind is None:
        row = base_row(folder, "unknown")
        row.update(
            status="unreadable",
            reason=f"no {PROFILE_JSON}, {RUN_JSON}, {TUNED_CONFIG}, {PLAN_JSON}, {RANKING_JSON} or "
            f"{BUCKETS_JSON}: not a tpu-tune run folder",
        )
        return row
    row = base_row(folder, kind)
    reader = {
        "profile": _read_profile,
        "tune": _read_tune,
        "plan": read_plan,
        "buckets": read_buckets,
        "ranking": read_ranking,
    }[kind]
    reader(folder, row, collection)
    return row


def _profile_fields(folder: Path, row: dict[str, Any]) -> dict[str, Any]:
    """Device, MFU, the peak it is of and the roofline coordinates of the folder's profile.json
    (returned). A tuning run's peak is its baseline profile's: tuned_config.toml names the tuned
    MFU's peak dtype, not its figure (report.md states the peak both MFUs are of)."""
    profile = load_json(folder / PROFILE_JSON, "workload", "device", "mfu", "achieved_flops_per_s", "peak_flops_per_s")
    device = profile["device"]
    row["model"] = nested(profile, "workload", "name")
    row["device"] = device.get("kind")
    row["device_name"] = device.get("name")
    row["peak_dtype"] = profile.get("peak_dtype")
    row["achieved_flops_per_s"] = profile.get("achieved_flops_per_s")
    row["peak_flops_per_s"] = profile.get("peak_flops_per_s")
    # Whose peak the MFU is of: a CPU's is measured by the probe, a chip's looked up (device_labels.py).
    row["peak_basis"] = peak_basis(device)
    row["peak_source"] = nested(device, "peak", "source")
    row["peak_bytes_per_s"] = nested(device, "peak", "memory_bytes_per_s")
    row["arithmetic_intensity"] = nested(profile, "verdict", "arithmetic_intensity")
    return profile


def _read_profile(folder: Path, row: dict[str, Any], collection: Collection) -> None:
    profile = _profile_fields(folder, row)
    row["mfu"] = row["baseline_mfu"] = profile["mfu"]
    row["step_s"] = row["baseline_step_s"] = nested(profile, "timing", "median")
    row["settings"] = _describe(profile.get("candidate") or {})
    row["date"] = date_of(profile.get("created")) or row["date"]
    row["report"] = report_link(folder, PROFILE_MD)


def _describe(candidate: dict[str, Any]) -> str:
    """A candidate dict or [settings] table (knob values, or the field style of older runs) in a
    few words: each knob's `label` (the execution, the matmul precision, every other knob set
    away from its default)."""
    try:
        parsed = Candidate.from_dict(candidate)
    except (TypeError, ValueError):  # a knob this version does not know: show it as written
        return ", ".join(f"{key}={value}" for key, value in candidate.items())
    return ", ".join(part for name, knob in knobs.REGISTRY.items() if (part := knob.label(parsed[name])))


def _unfinished_status(folder: Path) -> dict[str, str]:
    """Status of a tuning run without tuned_config.toml, from what run.json records: "failed"
    with its reason; "incomplete" when the recorded process is gone (same host, pid not alive);
    "running" only when it is alive. Runs written before run.json held a status fall back on
    the age of their newest file."""
    state = run_file.read(folder)
    if state.get("status") == "failed":
        return {
            "status": "failed",
            "reason": f"the run failed: {redact(str(state.get('reason') or 'no reason recorded'))}",
        }
    if state.get("status") == "searched":
        # A worker of a shared study: it searched, another worker (or `study finish`) verifies.
        return {
            "status": "searched",
            "reason": f"worker of study {state.get('study_name')!r}: "
            f"{redact(str(state.get('reason') or 'verified elsewhere'))}",
        }
    alive = run_file.process_alive(state) if state.get("status") == "running" else None
    if alive is False:
        return {
            "status": "incomplete",
            "reason": f"its process (pid {state.get('pid')}) is gone: the run stopped before it finished; "
            "continue it with --resume",
        }
    if alive is True:
        return {
            "status": "running",
            "reason": f"no {TUNED_CONFIG} yet: the run is still going (pid {state.get('pid')})",
        }
    newest = max((p.stat().st_mtime for p in folder.iterdir()), default=folder.stat().st_mtime)
    if time.time() - newest < LIVE_WINDOW_S:
        return {"status": "running", "reason": f"no {TUNED_CONFIG} yet: the run is still going"}
    return {"status": "incomplete", "reason": f"no {TUNED_CONFIG}: the run stopped before it finished"}


def _read_tune(folder: Path, row: dict[str, Any], collection: Collection) -> None:
    run = folder.name
    row["report"] = report_link(folder, REPORT_MD)
    if (folder / PROFILE_JSON).exists():
        # The baseline is profiled first: its time is the run's start (the MFU plot spans start to end).
        row["started"] = date_of(_profile_fields(folder, row).get("created"))
    if (folder / TRIALS_CSV).exists():
        try:
            trials = pd.read_csv(folder / TRIALS_CSV)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise ValueError(f"{TRIALS_CSV}: {str(exc).strip().splitlines()[0]}") from exc
        if "state" not in trials or "number" not in trials:
            raise ValueError(f"{TRIALS_CSV}: no 'number' and 'state' columns")
        collection.trials[run] = trials
        if "outcome" in trials:
            # The one vocabulary (studies/outcome.py): the same counts as report.md's "N measured, K failed".
            row["trials"] = int(trials["outcome"].isin([Outcome.MEASURED, Outcome.STOPPED_EARLY]).sum())
            row["failures"] = int((trials["outcome"] == Outcome.FAILED).sum())
        else:
            _count_older(trials, row)
    contributions = read_contributions(folder)

    if contributions is not None:
        collection.contributions[run] = contributions
    config_path = folder / TUNED_CONFIG
    if not config_path.exists():
        row.update(_unfinished_status(folder))
        return
    config = load_toml(config_path)
    prov = config.get("provenance")
    if not isinstance(prov, dict):
        raise ValueError(f"{TUNED_CONFIG}: no [provenance] table")
    row["model"] = nested(prov, "workload", "name") or row.get("model")
    row["device"] = config.get("device_kind") or row.get("device")
    row["device_name"] = prov.get("device") or row.get("device_name")
    row["date"] = date_of(prov.get("created")) or row["date"]
    row["settings"] = _describe(config.get("settings") or {})
    row["accuracy_error"] = prov.get("accuracy_error")
    row["baseline_mfu"] = nested(prov, "baseline", "mfu")
    row["baseline_step_s"] = nested(prov, "baseline", "step_median_s")
    row["tuned_mfu"] = nested(prov, "tuned", "mfu")
    row["step_s"] = nested(prov, "tuned", "step_median_s")
    row["peak_dtype"] = nested(prov, "tuned", "peak_dtype") or row.get("peak_dtype")
    # The peak the tuned MFU is of (the run's one peak: a trial may re-measure a CPU's above the
    # profile's); a config written before it was recorded keeps the profile's.
    row["peak_flops_per_s"] = nested(prov, "tuned", "peak_flops_per_s") or row.get("peak_flops_per_s")
    row["mfu"] = row["tuned_mfu"] if row["tuned_mfu"] is not None else row["baseline_mfu"]
    verification = prov.get("verification") or {}
    row["speedup"] = verification.get("speedup")
    row["speedup_ci_low"] = verification.get("ci_low")
    row["speedup_ci_high"] = verification.get("ci_high")
    row["significant"] = verification.get("significant")
    if row.get("trials") is None:
        row["trials"] = nested(prov, "study", "trials")


def _count_older(trials: pd.DataFrame, row: dict[str, Any]) -> None:
    """The measured and failed trials of a trials.csv written before its `outcome` column."""
    # Repeats of an earlier setting and settings rejected before running cost no measurement.
    measured = trials
    for column in (records.REPEAT_OF, records.REJECTED_BY, records.EXCLUDED_BY):
        if column in measured:
            measured = measured[measured[column].isna()]
    row["trials"] = len(measured)
    # A failed measurement: FAIL in studies of earlier versions, pruned with a failure kind later
    # (told so, so that TPE learns from it); an infeasible complete trial is no failure here.
    failed = measured["state"] == "FAIL"
    if records.FAILURE_KIND in measured:
        failed |= (measured["state"] == "PRUNED") & measured[records.FAILURE_KIND].notna()
    row["failures"] = int(failed.sum())
