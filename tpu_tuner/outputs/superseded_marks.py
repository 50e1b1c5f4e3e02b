"""A search figure that a window superseded, marked on a plot (tuning/verify/window_marks.py).

The run's plots and the dashboard's run figure draw it the same way: hollow at the search's
figure, an arrow to the window's, so a plot never shows the two unmarked.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from tpu_tuner.studies import records

SUPERSEDED_LABEL = "search figure superseded (arrow: the window's)"
COLOR = "tab:orange"


def superseded_rows(trials: pd.DataFrame) -> np.ndarray:
    """Which rows' search figures a window superseded (trials.csv's column, read back as text too)."""
    if records.SUPERSEDED not in trials:
        return np.zeros(len(trials), dtype=bool)
    marked = trials[records.SUPERSEDED].map(lambda v: v is True or v == 1 or str(v).strip().lower() == "true")
    return marked.to_numpy(dtype=bool)


def window_amortised(trials: pd.DataFrame) -> np.ndarray:
    """The window's amortised step of each row (seconds): its steady step with the search's compile
    share (the search's amortised step less its steady step)."""

    def column(name: str) -> np.ndarray:
        return pd.to_numeric(trials[name], errors="coerce").to_numpy(dtype=float)

    return column(records.AMORTISED_STEP_S) + column(records.WINDOW_STEP_S) - column(records.STEP_MEDIAN_S)


def mark_superseded(ax: Any, x: np.ndarray, search: np.ndarray, window: np.ndarray) -> None:
    """Hollow markers at the search's figures, each with an arrow to the window's."""
    ax.scatter(x, search, facecolors="none", edgecolors=COLOR, s=80, linewidths=1.5, label=SUPERSEDED_LABEL)
    for xi, a, b in zip(x, search, window):
        if np.isfinite(b):
            ax.annotate("", xy=(xi, b), xytext=(xi, a), arrowprops={"arrowstyle": "->", "color": COLOR})


__all__ = ["COLOR", "SUPERSEDED_LABEL", "mark_superseded", "superseded_rows", "window_amortised"]
