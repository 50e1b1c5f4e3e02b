"""One run folder's files as the dashboard reads them: JSON and TOML with one-line errors naming the
file, nested keys, dates, links to the folder's reports, and the row every folder starts from."""

from __future__ import annotations

import json
import math
import numbers
import re
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# A run without its last file whose files changed this recently is taken to be running.
LIVE_WINDOW_S = 600.0
STAMP = re.compile(r"(\d{8}-\d{6})")


def reason_of(exc: Exception) -> str:
    """One line naming the file and the problem (our ValueErrors already name the file)."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    return text if type(exc) is ValueError else f"{type(exc).__name__}: {text}"


def base_row(folder: Path, kind: str) -> dict[str, Any]:
    """The row every folder starts from: its name, kind and the date in its name (else its mtime)."""
    stamp = STAMP.search(folder.name)
    date = (
        datetime.strptime(stamp.group(1), "%Y%m%d-%H%M%S").replace(tzinfo=UTC)
        if stamp
        else datetime.fromtimestamp(folder.stat().st_mtime, UTC)
    )
    return {"run": folder.name, "kind": kind, "status": "ok", "reason": "", "date": date, "path": str(folder)}


def load_json(path: Path, *required: str) -> dict[str, Any]:
    """A JSON object holding the `required` keys, or a ValueError naming the file."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path.name}: invalid JSON: {exc.msg} at line {exc.lineno}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path.name}: expected a JSON object, found {type(data).__name__}")
    for key in required:
        if key not in data:
            raise ValueError(f"{path.name}: missing key {key!r}")
    return data


def load_toml(path: Path) -> dict[str, Any]:
    """A TOML document, or a ValueError naming the file."""
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path.name}: invalid TOML: {exc}") from exc


def nested(data: dict[str, Any], *keys: str, default: Any = None) -> Any:
    """data[k1][k2]..., or `default` where a key is missing."""
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return default
        data = data[key]
    return data


def date_of(text: Any) -> datetime | None:
    """An ISO date, or None."""
    try:
        return datetime.fromisoformat(str(text)) if text else None
    except ValueError:
        return None


def report_link(folder: Path, name: str) -> str:
    """The link to a report of the folder ("" when absent)."""
    # Relative to the results folder, so that links work from dashboard.html and over HTTP alike.
    return f"{folder.name}/{name}" if (folder / name).exists() else ""


def finite(value: Any) -> bool:
    """True for a real, finite number (numpy's too; not None, NaN, a bool or a string)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
