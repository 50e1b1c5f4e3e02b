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

import json
import logging
import math
import re
import time
import tomllib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from tpu_tuner.knobs import registry as knobs
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.core.credentials import redact
from tpu_tuner.core.run_folder import (BUCKETS_JSON, BUCKETS_MD, PLAN_JSON, PLAN_MD, PROFILE_JSON, PROFILE_MD, REPORT_MD,
                               RUN_JSON, TRIALS_CSV, TUNED_CONFIG)
from tpu_tuner.core.errors import UserInputError
from tpu_tuner.planner.ranking import RANKING_JSON, RANKING_MD
from tpu_tuner.studies import run_file
from tpu_tuner.studies import records

log = logging.getLogger(__name__)

# Columns of the runs table, in order; the --csv export writes exactly these.
COLUMNS = [
    "run", "kind", "status", "reason", "model", "device", "device_name", "date",
    "mfu", "baseline_mfu", "tuned_mfu", "peak_dtype", "speedup", "speedup_ci_low", "speedup_ci_high",
    "significant", "accuracy_error", "trials", "failures", "step_s", "baseline_step_s", "settings",
    "achieved_flops_per_s", "peak_flops_per_s", "peak_bytes_per_s", "arithmetic_intensity",
    "topology", "chips", "report", "path",
]
# The knobs a tuning run's trials.csv may hold (TRIAL_COLUMNS in tuning/result.py).
KNOBS = knobs.names()
# A tuning run without tuned_config.toml whose files changed this recently is taken to be running.
LIVE_WINDOW_S = 600.0
_STAMP = re.compile(r"(\d{8}-\d{6})")


@dataclass
class Collection:
    """Everything the dashboard shows: the runs table plus the per-run data behind the plots."""

    root: Path
    runs: pd.DataFrame
    trials: dict[str, pd.DataFrame] = field(default_factory=dict)  # run -> trials.csv
    plans: dict[str, dict[str, Any]] = field(default_factory=dict)  # run -> plan.json
    buckets: dict[str, dict[str, Any]] = field(default_factory=dict)  # run -> buckets.json
    rankings: dict[str, dict[str, Any]] = field(default_factory=dict)  # run -> ranking.json

    @property
    def live(self) -> bool:
        """True when a tuning run is still being written (the served page then refreshes)."""
        return bool((self.runs["status"] == "running").any()) if len(self.runs) else False

    def missing(self) -> list[str]:
        """What the page cannot show, in words (empty when every section has data)."""
        ok = self.runs[self.runs["status"] == "ok"] if len(self.runs) else self.runs
        kinds = set(ok["kind"]) if len(ok) else set()
        notes = []
        if not len(self.runs):
            notes.append(f"no run folders in {self.root}: run `tpu-tune profile`, `tpu-tune MODEL.py`, "
                         "`tpu-tune plan` or `tpu-tune buckets` with --out pointing here")
            return notes
        if not kinds & {"tune", "profile"}:
            notes.append("no readable tuning run or profile: no MFU to show")
        if "tune" not in kinds:
            notes.append("no finished tuning run: no per-trial plots")
        if "plan" not in kinds:
            notes.append("no planner result (`tpu-tune plan`): no plans section")
        if "buckets" not in kinds:
            notes.append("no bucketing result (`tpu-tune buckets`): no buckets section")
        return notes


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
        except Exception as exc:  # noqa: BLE001 - any failure of one folder must not stop the page
            log.warning("unreadable run folder %s: %s", folder, _reason(exc))
            row = _base_row(folder, _kind_of(folder) or "unknown")
            row.update(status="unreadable", reason=_reason(exc))
        if row is not None:
            rows.append(row)
        if row is not None and row["kind"] == "ranking":
            rows += _ranking_plans(folder, collection)
    if rows:
        frame = pd.DataFrame(rows).reindex(columns=COLUMNS)
        frame["date"] = pd.to_datetime(frame["date"], utc=True, errors="coerce")
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
    for name, kind in ((RANKING_JSON, "ranking"), (PLAN_JSON, "plan"), (BUCKETS_JSON, "buckets"), (RUN_JSON, "tune"),
                       (TUNED_CONFIG, "tune"), (PROFILE_JSON, "profile")):
        if (folder / name).exists():
            return kind
    return None


def _reason(exc: Exception) -> str:
    """One line naming the file and the problem (our ValueErrors already name the file)."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    return text if type(exc) is ValueError else f"{type(exc).__name__}: {text}"


def _base_row(folder: Path, kind: str) -> dict[str, Any]:
    stamp = _STAMP.search(folder.name)
    date = (datetime.strptime(stamp.group(1), "%Y%m%d-%H%M%S").replace(tzinfo=timezone.utc) if stamp
            else datetime.fromtimestamp(folder.stat().st_mtime, timezone.utc))
    return {"run": folder.name, "kind": kind, "status": "ok", "reason": "", "date": date, "path": str(folder)}


def _read_folder(folder: Path, collection: Collection) -> dict[str, Any] | None:
    kind = _kind_of(folder)
    if kind is None:
        row = _base_row(folder, "unknown")
        row.update(status="unreadable", reason=f"no {PROFILE_JSON}, {RUN_JSON}, {TUNED_CONFIG}, {PLAN_JSON}, {RANKING_JSON} or "
                                               f"{BUCKETS_JSON}: not a tpu-tune run folder")
        return row
    row = _base_row(folder, kind)
    reader = {"profile": _read_profile, "tune": _read_tune, "plan": _read_plan, "buckets": _read_buckets,
              "ranking": _read_ranking}[kind]
    reader(folder, row, collection)
    return row


def _load_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path.name}: invalid JSON: {exc.msg} at line {exc.lineno}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path.name}: expected a JSON object, found {type(data).__name__}")
    return data


def _load_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path.name}: invalid TOML: {exc}") from exc


def _get(data: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return default
        data = data[key]
    return data


def _date(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text)) if text else None
    except ValueError:
        return None


def _report(folder: Path, name: str) -> str:
    # Relative to the results folder, so that links work from dashboard.html and over HTTP alike.
    return f"{folder.name}/{name}" if (folder / name).exists() else ""


def _profile_fields(profile: dict[str, Any], row: dict[str, Any]) -> None:
    """Device, MFU and the roofline coordinates of a profile.json."""
    for key in ("workload", "device", "mfu", "achieved_flops_per_s", "peak_flops_per_s"):
        if key not in profile:
            raise ValueError(f"{PROFILE_JSON}: missing key {key!r}")
    device = profile["device"]
    row["model"] = _get(profile, "workload", "name")
    row["device"] = device.get("kind")
    row["device_name"] = device.get("name")
    row["peak_dtype"] = profile.get("peak_dtype")
    row["achieved_flops_per_s"] = profile.get("achieved_flops_per_s")
    row["peak_flops_per_s"] = profile.get("peak_flops_per_s")
    row["peak_bytes_per_s"] = _get(device, "peak", "memory_bytes_per_s")
    row["arithmetic_intensity"] = _get(profile, "verdict", "arithmetic_intensity")


def _read_profile(folder: Path, row: dict[str, Any], collection: Collection) -> None:
    profile = _load_json(folder / PROFILE_JSON)
    _profile_fields(profile, row)
    row["mfu"] = row["baseline_mfu"] = profile["mfu"]
    row["step_s"] = row["baseline_step_s"] = _get(profile, "timing", "median")
    row["settings"] = _describe(profile.get("candidate") or {})
    row["date"] = _date(profile.get("created")) or row["date"]
    row["report"] = _report(folder, PROFILE_MD)


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
        return {"status": "failed", "reason": f"the run failed: {redact(str(state.get('reason') or 'no reason recorded'))}"}
    if state.get("status") == "searched":
        # A worker of a shared study: it searched, another worker (or `study finish`) verifies.
        return {"status": "searched", "reason": f"worker of study {state.get('study_name')!r}: "
                                                f"{redact(str(state.get('reason') or 'verified elsewhere'))}"}
    alive = run_file.process_alive(state) if state.get("status") == "running" else None
    if alive is False:
        return {"status": "incomplete",
                "reason": f"its process (pid {state.get('pid')}) is gone: the run stopped before it finished; "
                          "continue it with --resume"}
    if alive is True:
        return {"status": "running", "reason": f"no {TUNED_CONFIG} yet: the run is still going (pid {state.get('pid')})"}
    newest = max((p.stat().st_mtime for p in folder.iterdir()), default=folder.stat().st_mtime)
    if time.time() - newest < LIVE_WINDOW_S:
        return {"status": "running", "reason": f"no {TUNED_CONFIG} yet: the run is still going"}
    return {"status": "incomplete", "reason": f"no {TUNED_CONFIG}: the run stopped before it finished"}


def _read_tune(folder: Path, row: dict[str, Any], collection: Collection) -> None:
    run = folder.name
    row["report"] = _report(folder, REPORT_MD)
    if (folder / PROFILE_JSON).exists():
        _profile_fields(_load_json(folder / PROFILE_JSON), row)
    if (folder / TRIALS_CSV).exists():
        try:
            trials = pd.read_csv(folder / TRIALS_CSV)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise ValueError(f"{TRIALS_CSV}: {str(exc).strip().splitlines()[0]}") from exc
        if "state" not in trials or "number" not in trials:
            raise ValueError(f"{TRIALS_CSV}: no 'number' and 'state' columns")
        collection.trials[run] = trials
        # Repeats of an earlier setting and settings rejected before running cost no measurement.
        measured = trials
        for column in (records.REPEAT_OF, records.REJECTED_BY, records.EXCLUDED_BY):
            if column in measured:
                measured = measured[measured[column].isna()]
        row["trials"] = len(measured)
        # A failed measurement: FAIL in studies of earlier versions, pruned with a failure kind now
        # (told so, so that TPE learns from it); an infeasible complete trial is no failure here.
        failed = measured["state"] == "FAIL"
        if records.FAILURE_KIND in measured:
            failed |= (measured["state"] == "PRUNED") & measured[records.FAILURE_KIND].notna()
        row["failures"] = int(failed.sum())
    config_path = folder / TUNED_CONFIG
    if not config_path.exists():
        row.update(_unfinished_status(folder))
        return
    config = _load_toml(config_path)
    prov = config.get("provenance")
    if not isinstance(prov, dict):
        raise ValueError(f"{TUNED_CONFIG}: no [provenance] table")
    row["model"] = _get(prov, "workload", "name") or row.get("model")
    row["device"] = config.get("device_kind") or row.get("device")
    row["device_name"] = prov.get("device") or row.get("device_name")
    row["date"] = _date(prov.get("created")) or row["date"]
    row["settings"] = _describe(config.get("settings") or {})
    row["accuracy_error"] = prov.get("accuracy_error")
    row["baseline_mfu"] = _get(prov, "baseline", "mfu")
    row["baseline_step_s"] = _get(prov, "baseline", "step_median_s")
    row["tuned_mfu"] = _get(prov, "tuned", "mfu")
    row["step_s"] = _get(prov, "tuned", "step_median_s")
    row["peak_dtype"] = _get(prov, "tuned", "peak_dtype") or row.get("peak_dtype")
    row["mfu"] = row["tuned_mfu"] if row["tuned_mfu"] is not None else row["baseline_mfu"]
    verification = prov.get("verification") or {}
    row["speedup"] = verification.get("speedup")
    row["speedup_ci_low"] = verification.get("ci_low")
    row["speedup_ci_high"] = verification.get("ci_high")
    row["significant"] = verification.get("significant")
    if row.get("trials") is None:
        row["trials"] = _get(prov, "study", "trials")


def _read_plan(folder: Path, row: dict[str, Any], collection: Collection) -> None:
    plan = _load_json(folder / PLAN_JSON)
    for key in ("workload", "topology", "plans"):
        if key not in plan:
            raise ValueError(f"{PLAN_JSON}: missing key {key!r}")
    if not isinstance(plan["plans"], list):
        raise ValueError(f"{PLAN_JSON}: 'plans' is not a list")
    collection.plans[row["run"]] = plan  # a ranking's plan: "<ranking folder>/<plan folder>"
    row["model"] = plan["workload"] + (f"_{plan['preset']}" if plan.get("preset") else "")
    row["device"] = "tpu"
    row["topology"] = _get(plan, "topology", "name")
    row["chips"] = _get(plan, "topology", "chips")
    row["device_name"] = row["topology"]
    predicted = [p["prediction"]["mfu"] for p in plan["plans"]
                 if p.get("fits") and isinstance(p.get("prediction"), dict) and p["prediction"].get("mfu") is not None]
    row["mfu"] = max(predicted) if predicted else None
    row["trials"] = len(plan["plans"])
    row["failures"] = sum(1 for p in plan["plans"] if not p.get("prediction"))
    row["settings"] = f"best layout {plan['best']}" if plan.get("best") else "no layout fits"
    row["report"] = f"{row['run']}/{PLAN_MD}" if (folder / PLAN_MD).exists() else ""


def _read_ranking(folder: Path, row: dict[str, Any], collection: Collection) -> None:
    data = _load_json(folder / RANKING_JSON)
    for key in ("source", "slices", "topologies", "prices"):
        if key not in data:
            raise ValueError(f"{RANKING_JSON}: missing key {key!r}")
    if not isinstance(data["slices"], list) or not all(isinstance(s, dict) and "topology" in s for s in data["slices"]):
        raise ValueError(f"{RANKING_JSON}: 'slices' is not a list of ranked slices")
    collection.rankings[folder.name] = data
    row["model"] = (data.get("workload") or data["source"]) + (f"_{data['preset']}" if data.get("preset") else "")
    row["device"] = "tpu"
    row["topology"] = ", ".join(map(str, data["topologies"]))
    row["device_name"] = row["topology"]
    row["trials"] = len(data["slices"])
    first = next((s for s in data["slices"] if s.get("fits")), None)
    row["settings"] = f"first: {first['topology']}" if first else "nothing fits"
    if len(data["slices"]) < len(data["topologies"]):
        # Being planned while its plan folders' files (compiler.log, ...) keep changing; else stopped.
        newest = max((f.stat().st_mtime for f in folder.rglob("*")), default=folder.stat().st_mtime)
        state = "running" if time.time() - newest < LIVE_WINDOW_S else "incomplete"
        row.update(status=state, reason=f"{len(data['slices'])} of {len(data['topologies'])} slices planned")
    row["date"] = _date(data.get("created")) or row["date"]
    row["report"] = _report(folder, RANKING_MD)


def _ranking_plans(folder: Path, collection: Collection) -> list[dict[str, Any]]:
    """The rows of a ranking folder's plan folders, each named "<ranking folder>/<plan folder>"."""
    rows = []
    for child in sorted(p for p in folder.iterdir() if p.is_dir() and (p / PLAN_JSON).exists()):
        row = _base_row(child, "plan")
        row["run"] = f"{folder.name}/{child.name}"
        try:
            _read_plan(child, row, collection)
        except Exception as exc:  # noqa: BLE001 - as collect(): one bad folder never hides the others
            row.update(status="unreadable", reason=_reason(exc))
        rows.append(row)
    return rows


def _read_buckets(folder: Path, row: dict[str, Any], collection: Collection) -> None:
    data = _load_json(folder / BUCKETS_JSON)
    for key in ("workload", "histogram", "chosen_buckets"):
        if key not in data:
            raise ValueError(f"{BUCKETS_JSON}: missing key {key!r}")
    hist = data["histogram"]
    if len(hist.get("lengths", [])) != len(hist.get("counts", [])):
        raise ValueError(f"{BUCKETS_JSON}: histogram lengths and counts differ in length")
    collection.buckets[folder.name] = data
    row["model"] = data["workload"]
    row["device"] = data.get("device")
    row["settings"] = "buckets " + ", ".join(str(b) for b in data["chosen_buckets"])
    row["report"] = _report(folder, BUCKETS_MD)


def finite(value: Any) -> bool:
    """True for a real, finite number (not None, NaN or a string)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
