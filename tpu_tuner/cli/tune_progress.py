"""The tune command's progress on the terminal: one line an event, repeated rejections counted."""

from __future__ import annotations

from collections import Counter

from tpu_tuner.core.units import duration, ms
from tpu_tuner.tuning.run.progress import Progress

# Phases of the search itself; any other event (the verification, the end) closes the search.
SEARCH_PHASES = ("trial", "learn")


class ProgressLines:
    """Prints each progress event as one line, except a rejection whose reason was printed
    already: those are counted, and each reason's count printed once when the search is over
    (every rejection stays in report.md and trials.csv)."""

    def __init__(self) -> None:
        self.rejections: Counter[str] = Counter()

    def __call__(self, event: Progress) -> None:
        if event.rejected_by is not None:
            self.rejections[event.rejected_by] += 1
            if self.rejections[event.rejected_by] > 1:
                return
        elif event.phase not in SEARCH_PHASES:
            self.summarise(event.elapsed)
        print(line(event), flush=True)

    def summarise(self, elapsed: float) -> None:
        """One line per reason that rejected more than one setting, with the count."""
        for reason, count in self.rejections.items():
            if count > 1:
                print(
                    f"[search | {elapsed:5.0f} s] rejected {count} settings unmeasured ({reason}); "
                    "each is in report.md and trials.csv",
                    flush=True,
                )
        self.rejections.clear()


def line(event: Progress) -> str:
    """`[trial 7 | budget 5/36 | best 190 ms amortised |    61 s, 2.9 min left] message`."""
    # "best" is the same quantity a finished trial's line leads with (its objective).
    best = f"best {ms(event.best_seconds)} {event.objective}" if event.best_seconds else "best -"
    # The search's best belongs on trial lines only; other phases show where and when.
    if event.trial and event.number is not None:
        # The trial's own number (report.md's, trials.csv's), then where the budget stands.
        where = f"trial {event.number} | budget {event.trial}/{event.trials} | {best}"
    else:
        where = f"budget {event.trial}/{event.trials} | {best}" if event.trial else event.phase
    left = f", {duration(event.time_left)} left" if event.time_left is not None else ""
    return f"[{where} | {event.elapsed:5.0f} s{left}] {event.message}"
