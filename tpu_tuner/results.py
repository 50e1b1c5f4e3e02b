"""Run folders: results/<model>-<kind>-<timestamp>/, one per run, never overwritten."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path


def new_run_dir(root: str | Path, model: str, kind: str | None = None) -> Path:
    """Create and return a fresh run folder under `root`."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    safe_model = re.sub(r"[^A-Za-z0-9_.-]+", "_", model)
    base = "-".join(part for part in (safe_model, kind, stamp) if part)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for attempt in range(1000):
        candidate = root / (base if attempt == 0 else f"{base}-{attempt}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise RuntimeError(f"could not create a run folder under {root}")
