"""What the dashboard collected from a results folder (`Collection`): the runs table and each run's
data behind the plots. Its own module, below the readers that fill it (collect.py, which reads the
tuning and profile folders, and planner_folders.py, the plan, ranking and bucketing ones), so that
each reader names the type without importing the other."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from tpu_tuner.dashboard.contributions import Contributions


@dataclass
class Collection:
    """Everything the dashboard shows: the runs table plus the per-run data behind the plots."""

    root: Path
    runs: pd.DataFrame
    trials: dict[str, pd.DataFrame] = field(default_factory=dict)  # run -> trials.csv
    plans: dict[str, dict[str, Any]] = field(default_factory=dict)  # run -> plan.json
    buckets: dict[str, dict[str, Any]] = field(default_factory=dict)  # run -> buckets.json
    rankings: dict[str, dict[str, Any]] = field(default_factory=dict)  # run -> ranking.json
    # run -> each knob's measured contribution (result.json's verification), where the run has one
    contributions: dict[str, Contributions] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        """True when a tuning run is still being written (the served page then refreshes)."""
        return bool((self.runs["status"] == "running").any()) if len(self.runs) else False

    def missing(self) -> list[str]:
        """What the page as a whole cannot show, in words: only that the folder holds no run. Each
        section says itself what it lacks, so that no notice appears twice."""
        if len(self.runs):
            return []
        return [
            f"no run folders in {self.root}: run `tpu-tune profile`, `tpu-tune MODEL.py`, "
            "`tpu-tune plan` or `tpu-tune buckets` with --out pointing here"
        ]
