"""The verification's window: rounds added until the interval decides, disturbed rounds re-run.

The window first runs the planned rounds, then *looks*: the speedup of the best over the baseline
on the rounds that are not disturbed (metrics/disturbed.py), with its interval at the look's level
(metrics/paired.py, `look_level`). While the interval cannot decide (it holds 1 and reaches past
`MIN_GAIN`, or its lower end is under `PRECISE_SHARE` of the estimate), half as many good rounds
again are added (at least `MIN_ADDED`), and every disturbed round is replaced by another, for as
long as the clock has room for one more round (or, without a clock, up to `max_rounds`); then it
looks again. When the time is gone, the last look's interval is the verdict: verified, no gain,
or undecided.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tpu_tuner.metrics.disturbed import disturbed_rounds
from tpu_tuner.metrics.paired import PairedSpeedup, VerdictKind, look_level, paired_speedup
from tpu_tuner.tuning.interleaved import InterleavedWindow, VerifyProgress

MIN_ADDED = 2


@dataclass(frozen=True)
class DecidedWindow:
    """What the window measured: every round's steps per candidate, the disturbed rounds' indices
    (0-based), the speedup of the last look on the other rounds, and why adding rounds stopped."""

    samples: list[list[float]]
    disturbed: list[int]
    speedup: PairedSpeedup
    looks: int
    stopped_by: str  # "decided" | "clock" | "rounds"
    compiles: dict[str, int]  # compiles seen while comparing, by kind
    processes: int = 1  # processes the settings ran in (more than one: start-up environments differ)
    notes: tuple[str, ...] = ()  # what the jobs found of their timing (a step scaled to hold its work)

    @property
    def verdict(self) -> VerdictKind:
        return self.speedup.verdict

    def kept(self, candidate: int) -> list[float]:
        """The candidate's steps in the rounds that were not disturbed."""
        return [s for i, s in enumerate(self.samples[candidate]) if i not in self.disturbed]


def measure_until_decided(
    window: InterleavedWindow,
    first_rounds: int,
    max_rounds: int,
    seconds_left: Callable[[], float | None],
    progress: VerifyProgress | None = None,
) -> DecidedWindow | str:
    """Run `window` as the module says: `first_rounds` rounds whatever the clock (the finish's plan
    fitted them to it), then rounds while undecided, each only when `seconds_left()` (None: no
    clock) holds the window's estimate of a round, and never beyond `max_rounds` in all. Returns
    why a round failed, else the decided (or timed-out) window. The window is closed either way."""
    first_rounds = max(2, first_rounds)
    try:
        target, looks, stopped_by = first_rounds, 0, ""
        looked: tuple[int, PairedSpeedup] | None = None  # the rounds at the last look, and its figure
        while True:
            disturbed = disturbed_rounds(window.samples)
            while window.rounds - len(disturbed) < target:
                if window.rounds >= first_rounds:
                    if window.rounds >= max_rounds:
                        stopped_by = "rounds"
                        break
                    left = seconds_left()
                    if left is not None and left < window.seconds_per_round():
                        stopped_by = "clock"
                        break
                chunk = window.per_job or target + len(disturbed) - window.rounds
                failure = window.run(min(chunk, max(1, max_rounds - window.rounds)))
                if failure is not None:
                    return failure
                disturbed = disturbed_rounds(window.samples)
                if progress is not None:
                    good = [i for i in range(window.rounds) if i not in disturbed]
                    planned = window.rounds + max(0, target - len(good))
                    progress(window.rounds, planned, window.running_ratio(good))
            if looked is not None and looked[0] == window.rounds:
                # Nothing was added since the last look (the clock had no room): that look stands, and
                # another at a stricter level would only widen the same interval.
                return DecidedWindow(
                    window.samples,
                    disturbed,
                    looked[1],
                    looks,
                    stopped_by,
                    window.compiles,
                    len(window.groups),
                    tuple(dict.fromkeys(window.notes)),
                )
            looks += 1
            good_rounds = [i for i in range(window.rounds) if i not in disturbed]
            if len(good_rounds) < 2:
                return f"only {len(good_rounds)} of {window.rounds} rounds were undisturbed"
            speedup = paired_speedup(
                [window.samples[0][i] for i in good_rounds],
                [window.samples[1][i] for i in good_rounds],
                level=look_level(looks),
            )
            looked = (window.rounds, speedup)
            if speedup.decided:
                stopped_by = "decided"
            if stopped_by:
                return DecidedWindow(
                    window.samples,
                    disturbed,
                    speedup,
                    looks,
                    stopped_by,
                    window.compiles,
                    len(window.groups),
                    tuple(dict.fromkeys(window.notes)),
                )
            target = len(good_rounds) + max(MIN_ADDED, len(good_rounds) // 2)
    finally:
        window.close()
