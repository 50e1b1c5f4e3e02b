"""The planner's and the bucketing study's folders read into the runs table: plan.json, ranking.json
(with its plan folders, one a slice) and buckets.json."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tpu_tuner.core.run_folder import BUCKETS_JSON, BUCKETS_MD, PLAN_JSON, PLAN_MD
from tpu_tuner.dashboard.collection import Collection
from tpu_tuner.dashboard.folder_files import LIVE_WINDOW_S, base_row, date_of, load_json, nested, reason_of, report_link
from tpu_tuner.model.decoders.decoder_shape import INLINE_PREFIX
from tpu_tuner.planner.plans.ranking import RANKING_JSON, RANKING_MD


def read_plan(folder: Path, row: dict[str, Any], collection: Collection) -> None:
    plan = load_json(folder / PLAN_JSON, "workload", "topology", "plans")
    if not isinstance(plan["plans"], list):
        raise ValueError(f"{PLAN_JSON}: 'plans' is not a list")
    collection.plans[row["run"]] = plan  # a ranking's plan: "<ranking folder>/<plan folder>"
    # An inline shape's workload is always "decoder": the shape itself names the model.
    source = str(plan.get("source") or "")
    row["model"] = (source if source.startswith(INLINE_PREFIX) else plan["workload"]) + (
        f"_{plan['preset']}" if plan.get("preset") else ""
    )
    row["device"] = "tpu"
    row["topology"] = nested(plan, "topology", "name")
    row["chips"] = nested(plan, "topology", "chips")
    row["device_name"] = row["topology"]
    predicted = [
        p["prediction"]["mfu"]
        for p in plan["plans"]
        if p.get("fits") and isinstance(p.get("prediction"), dict) and p["prediction"].get("mfu") is not None
    ]
    row["mfu"] = max(predicted) if predicted else None
    row["trials"] = len(plan["plans"])
    row["failures"] = sum(1 for p in plan["plans"] if not p.get("prediction"))
    row["settings"] = f"best layout {plan['best']}" if plan.get("best") else "no layout fits"
    row["report"] = f"{row['run']}/{PLAN_MD}" if (folder / PLAN_MD).exists() else ""


def read_ranking(folder: Path, row: dict[str, Any], collection: Collection) -> None:
    data = load_json(folder / RANKING_JSON, "source", "slices", "topologies", "prices")
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
    row["date"] = date_of(data.get("created")) or row["date"]
    row["report"] = report_link(folder, RANKING_MD)


def ranking_plans(folder: Path, collection: Collection) -> list[dict[str, Any]]:
    """The rows of a ranking folder's plan folders, each named "<ranking folder>/<plan folder>"."""
    rows = []
    for child in sorted(p for p in folder.iterdir() if p.is_dir() and (p / PLAN_JSON).exists()):
        row = base_row(child, "plan")
        row["run"] = f"{folder.name}/{child.name}"
        try:
            read_plan(child, row, collection)
        except Exception as exc:
            row.update(status="unreadable", reason=reason_of(exc))
        rows.append(row)
    return rows


def read_buckets(folder: Path, row: dict[str, Any], collection: Collection) -> None:
    data = load_json(folder / BUCKETS_JSON, "workload", "histogram", "chosen_buckets")
    hist = data["histogram"]
    if len(hist.get("lengths", [])) != len(hist.get("counts", [])):
        raise ValueError(f"{BUCKETS_JSON}: histogram lengths and counts differ in length")
    collection.buckets[folder.name] = data
    row["model"] = data["workload"]
    row["device"] = data.get("device")
    # The chip or host the costs were measured on (results written before it was kept name the kind only).
    row["device_name"] = data.get("device_name") or None
    row["settings"] = "buckets " + ", ".join(str(b) for b in data["chosen_buckets"])
    row["report"] = report_link(folder, BUCKETS_MD)
