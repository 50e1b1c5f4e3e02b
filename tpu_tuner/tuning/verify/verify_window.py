"""The verification's window: rounds added until the interval decides, disturbed rounds re-run.

The window first runs the planned rounds, then *looks*: the speedup of the best over the baseline
on the rounds that are not disturbed (metrics/disturbed.py), with its interval at the look's level
(metrics/paired.py, `look_level`). While the interval cannot decide (it holds 1 and reaches past
`MIN_GAIN`, or its lower end is under `PRECISE_SHARE` of the estimate), half as many good rounds
again are added (at least `MIN_ADDED`), and every disturbed round is replaced by another, for as
long as the clock has room for one more round (or, without a clock, up to `max_rounds`); then it
looks again. When the time is gone, the last look's interval is the verdict: verified, no gain,
or undecided.

Each look also judges every setting's rounds, and the baseline/best ratio, for two clusters or a
drift (metrics/unsteady.py). A decided look that finds one adds rounds once more, as an undecided
look would, where the clock has room (a switch that comes and goes shows in more rounds, and a
drift either settles or goes on); the last look's findings go with the verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tpu_tuner.metrics.disturbed import disturbed_rounds
from tpu_tuner.metrics.paired import PairedSpeedup, VerdictKind, look_level, paired_speedup
from tpu_tuner.metrics.unsteady import Unsteady, unsteady_settings
from tpu_tuner.tuning.verify.interleaved import InterleavedWindow, VerifyProgress

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
    block: int = 0  # rounds a block ran, alternating between those processes (0: one process)
    notes: tuple[str, ...] = ()  # what was found of the window beside its rounds (search_agreement.py)
    # The settings the last look judged unsteady (metrics/unsteady.py), and the rounds added for them
    # after a look that had decided (None: none was asked for; 0: the clock had no room).
    unsteady: tuple[Unsteady, ...] = ()
    added_for_unsteady: int | None = None
    apart: str = ""  # why the settings ran in groups of their own (`InterleavedWindow.apart`)

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
    labels: Sequence[str] = ("baseline", "best"),
) -> DecidedWindow | str:
    """Run `window` as the module says: `first_rounds` rounds whatever the clock (the finish's plan
    fitted them to it), then rounds while undecided (or once more for an unsteady setting), each
    only when `seconds_left()` (None: no clock) holds the window's estimate of a round, and never
    beyond `max_rounds` in all; `labels` name the window's settings in what it finds. Returns why a
    round failed, else the decided (or timed-out) window. The window is closed either way."""
    first_rounds = max(2, first_rounds)
    labels = [*labels, *(f"setting {i + 1}" for i in range(len(labels), len(window.samples)))]
    try:
        target, looks, stopped_by = first_rounds, 0, ""
        looked: tuple[int, PairedSpeedup] | None = None  # the rounds at the last look, and its figure
        unsteady: list[Unsteady] = []
        extended_at: int | None = None  # the rounds when a decided look asked for more for an unsteady setting

        def outcome(disturbed: list[int], speedup: PairedSpeedup) -> DecidedWindow:
            return DecidedWindow(
                window.samples,
                disturbed,
                speedup,
                looks,
                "decided" if speedup.decided else stopped_by,
                window.compiles,
                len(window.groups),
                window.block if window.per_process else 0,
                (),
                tuple(unsteady),
                None if extended_at is None else window.rounds - extended_at,
                window.apart,
            )

        while True:
            disturbed = disturbed_rounds(window.samples)
            while window.rounds - len(disturbed) < target:
                if window.rounds >= first_rounds:
                    if window.rounds >= max_rounds:
                        stopped_by = "rounds"
                        break
                    left = seconds_left()
                    # A chunk is what the window runs next (a block of rounds where settings need
                    # processes of their own): the clock must hold all of it.
                    if left is not None and left < window.seconds_per_round() * (window.per_job or 1):
                        stopped_by = "clock"
                        break
                chunk = window.per_job or target + len(disturbed) - window.rounds
                failure = window.run(min(chunk, max(1, max_rounds - window.rounds)))
                if failure is not None:
                    return failure
                disturbed = disturbed_rounds(window.samples)
                if progress is not None:
                    good = [i for i in range(window.rounds) if i not in disturbed]
                    # The first plan as the total, whatever is added: a total that moved ("4/13",
                    # "6/12", "13/18") said nothing; the words say the rounds beyond it (study.py).
                    progress(window.rounds, first_rounds, window.running_ratio(good))
            if looked is not None and looked[0] == window.rounds:
                # Nothing was added since the last look (the clock had no room): that look stands, and
                # another at a stricter level would only widen the same interval.
                return outcome(disturbed, looked[1])
            looks += 1
            good_rounds = [i for i in range(window.rounds) if i not in disturbed]
            if len(good_rounds) < 2:
                return f"only {len(good_rounds)} of {window.rounds} rounds were undisturbed"
            speedup = replace(
                paired_speedup(
                    [window.samples[0][i] for i in good_rounds],
                    [window.samples[1][i] for i in good_rounds],
                    level=look_level(looks),
                ),
                overall=True,  # stated as the looks' 95% together (metrics/paired.py)
            )
            looked = (window.rounds, speedup)
            unsteady = unsteady_settings(window.samples, labels)
            if speedup.decided and not (unsteady and extended_at is None):
                stopped_by = "decided"
            elif speedup.decided:
                extended_at = window.rounds  # decided, but a setting is unsteady: more rounds, once
            if stopped_by:
                return outcome(disturbed, speedup)
            target = len(good_rounds) + max(MIN_ADDED, len(good_rounds) // 2)
    finally:
        window.close()


def window_notes(decided: DecidedWindow) -> str:
    """What the window found besides its interval, each after "; ": the disturbed rounds left out
    (each re-run where the clock allowed: the rounds kept are in the interval's count), groups of
    their own, what was found against the search, unsteady settings; empty when none."""
    rerun = len(decided.disturbed)
    notes = (
        f"; {rerun} disturbed round{'s' if rerun > 1 else ''} left out "
        f"({', '.join(str(i + 1) for i in decided.disturbed)})"
        if rerun
        else ""
    )
    if decided.processes > 1:
        notes += f"; compared in {decided.processes} {decided.apart}, alternating every {decided.block} rounds"
    notes += "".join(f"; {note}" for note in decided.notes)
    return notes + unsteady_note(decided)


def unsteady_note(decided: DecidedWindow) -> str:
    """The settings whose rounds the last look found bimodal or drifting, and the rounds added for
    them (metrics/unsteady.py); empty when none was."""
    if not decided.unsteady:
        return ""
    them = "it" if len(decided.unsteady) == 1 else "them"
    added = decided.added_for_unsteady
    said = (
        ""
        if added is None
        else f"; the clock left no room to add rounds for {them}"
        if added == 0
        else f"; {added} round{'s' if added > 1 else ''} added for {them}"
    )
    return f"; unsteady rounds: {', '.join(u.describe() for u in decided.unsteady)}{said}"
