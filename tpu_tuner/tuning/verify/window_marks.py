"""One figure per setting: the search's figure of a trial that a window timed again, marked.

The search times each setting once, at its own moment; the race and the verification time the
leaders, the baseline and the best again, round-robin. Where the two disagree beyond both
spreads (their p10-p90 ranges do not overlap; for a race entry, which keeps no spread, beyond
`OFF_SEARCH_RATIO`), the window's figure stands (tuning/verify/window_figures.py says why).
A run must not then show the search's figure unmarked beside it: trials.csv carries the window's
step and MFU beside the search's and marks the row, report.md's trials table and the plots mark
it, and the dashboard reads trials.csv. Agreeing figures are left as the search measured them,
with the window's step beside them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tpu_tuner.core.units import duration
from tpu_tuner.execution.measurement import Measurement
from tpu_tuner.studies.records import FIGURE_NOTE, SUPERSEDED, WINDOW_MFU, WINDOW_STEP_S
from tpu_tuner.tuning.verify.race import RaceEntry
from tpu_tuner.tuning.verify.search_agreement import OFF_SEARCH_RATIO
from tpu_tuner.tuning.verify.window_figures import beyond_spreads


@dataclass(frozen=True)
class WindowMark:
    """What a window measured of one trial's setting, and whether the search's figure stands."""

    step_s: float  # the window's median steady step
    mfu: float | None  # of that step, on the run's peak (None: a race entry, timed as amortised)
    superseded: bool  # the search's figure disagrees beyond both spreads: the window's stands
    note: str  # in words, for trials.csv and report.md's trials table

    def columns(self) -> dict[str, Any]:
        """The mark as trials.csv's columns."""
        return {WINDOW_STEP_S: self.step_s, WINDOW_MFU: self.mfu, SUPERSEDED: self.superseded, FIGURE_NOTE: self.note}


def mark_against_window(search: Measurement | None, window: Measurement, where: str) -> WindowMark:
    """The mark of a trial whose setting `where` (e.g. "the verification window") timed as
    `window` (the search's measurement with the window's steady step, on the run's peak)."""
    # Superseded by either rule a run states: spreads that do not overlap, or the verdict's own
    # `OFF_SEARCH_RATIO` (a run's verdict named a 1.5x disagreement that wide spreads overlapped).
    ratio = window.step_median / search.step_median if search is not None and search.step_median > 0 else 1.0
    apart = search is not None and search.step_median > 0 and beyond_spreads(search, window)
    superseded = apart or ratio > OFF_SEARCH_RATIO or ratio < 1 / OFF_SEARCH_RATIO
    if superseded and search is not None:
        why = "beyond both spreads" if apart else f"more than {OFF_SEARCH_RATIO:g}x apart"
        note = (
            f"search figure superseded: {where} timed {duration(window.step_median)} "
            f"({ratio:.2f}x the search's {duration(search.step_median)}), {why}"
        )
    else:
        note = f"{where} timed {duration(window.step_median)}, within the search's spread"
    return WindowMark(window.step_median, window.mfu, superseded, note)


def mark_against_race(entry: RaceEntry) -> WindowMark:
    """The mark of a raced trial: the race keeps amortised medians only, so the search's figure
    is superseded where the two are more than `OFF_SEARCH_RATIO` apart (search_agreement.py's rule)."""
    ratio = entry.interleaved_amortised_s / entry.search_amortised_s if entry.search_amortised_s > 0 else 1.0
    superseded = ratio > OFF_SEARCH_RATIO or ratio < 1 / OFF_SEARCH_RATIO
    words = f"the race timed {duration(entry.interleaved_amortised_s)} amortised"
    if superseded:
        note = f"search figure superseded: {words} ({ratio:.2f}x the search's {duration(entry.search_amortised_s)})"
    else:
        note = f"{words}, within {OFF_SEARCH_RATIO:g}x of the search's"
    return WindowMark(entry.interleaved_amortised_s, None, superseded, note)


def race_marks(race: Sequence[RaceEntry]) -> dict[int, WindowMark]:
    """Each raced trial's mark."""
    return {entry.trial: mark_against_race(entry) for entry in race}


__all__ = [
    "WindowMark",
    "mark_against_race",
    "mark_against_window",
    "race_marks",
]
