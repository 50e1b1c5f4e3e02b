"""The window against the search: a setting the window measures far off its search figure is
re-measured alone before the verdict is taken.

The search times each setting in a worker of its own; the window builds them side by side. On a
TPU v5e chip the two disagreed: a `--space torchtpu` run measured `tpu` compile + bf16 at 165 ms
and the baseline at 243 ms in the search, both at ~318 ms in the window, and kept the baseline
("no gain"). Whatever the cause (steps resident together, a process's state), a window figure more
than `OFF_SEARCH_RATIO` from the search's is said in the report, and the window is run again with
every setting in a group of its own (built, timed and freed in turn, never resident beside
another); that window's verdict is the one taken.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace

from tpu_tuner.core.units import duration
from tpu_tuner.tuning.verify.interleaved import InterleavedWindow
from tpu_tuner.tuning.verify.verify_window import DecidedWindow

# A window step this far from the search's (either way) is beyond what the chip's and CPU's
# settings showed between two measurements of one setting in processes of their own.
OFF_SEARCH_RATIO = 1.2


def off_search(decided: DecidedWindow, labels: Sequence[str], search_steps: Sequence[float | None]) -> list[str]:
    """Each setting whose window median is more than `OFF_SEARCH_RATIO` from its search figure, in
    words ("baseline: 318 ms in the window against 243 ms in the search (1.31x)")."""
    found = []
    for index, (label, searched) in enumerate(zip(labels, search_steps)):
        kept = decided.kept(index)
        if searched is None or searched <= 0 or not kept:
            continue
        window = statistics.median(kept)
        ratio = window / searched
        if ratio > OFF_SEARCH_RATIO or ratio < 1 / OFF_SEARCH_RATIO:
            found.append(
                f"{label}: {duration(window)} in the window against {duration(searched)} in the search ({ratio:.2f}x)"
            )
    return found


def agreed_window(
    window: Callable[[bool], InterleavedWindow],
    measure: Callable[[InterleavedWindow], DecidedWindow | str],
    labels: Sequence[str],
    search_steps: Sequence[float | None],
    seconds_left: Callable[[], float | None],
    now: Callable[[], float],
) -> DecidedWindow | str:
    """`measure(window(False))`, and where a setting's figure is off its search's (`off_search`),
    `measure(window(True))` (every setting alone) if the clock has room for a window as long as
    the first; the window whose verdict stands, with what was found in its notes."""
    started = now()
    first = measure(window(False))
    if isinstance(first, str):
        return first
    found = off_search(first, labels, search_steps)
    if not found:
        return first
    said = f"the window disagreed with the search ({'; '.join(found)})"
    left = seconds_left()
    if left is not None and left < now() - started:
        return replace(first, notes=(*first.notes, f"{said}; the clock left no room to re-measure each setting alone"))
    again = measure(window(True))
    if isinstance(again, str):
        return replace(first, notes=(*first.notes, f"{said}; re-measuring each setting alone failed ({again})"))
    still = off_search(again, labels, search_steps)
    after = f"still off the search alone ({'; '.join(still)})" if still else "alone, each agreed with the search"
    return replace(again, notes=(*again.notes, f"{said}; re-measured with each setting alone: {after}"))
