"""The verification window's own step figures: baseline and best measured together.

The search measures each setting once, at its own moment; on a shared machine one of those
moments can be disturbed (a baseline read 447 ms by the search was ~45 ms interleaved), and the
ratio of two such figures says little. The verification times baseline and best round-robin in
one worker, so the steps it saw are the ones to print beside the verified speedup: each label's
median over the rounds (a ratio of medians, close to but not the same estimator as the paired
geometric mean the speedup is).

Only step figures live here; MFU is derived from them where the run's peak is known
(`TuningResult.compared`, through metrics/mfu.py), and compile time, memory and accuracy stay
the search's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from tpu_tuner.execution.measurement import Measurement
from tpu_tuner.metrics.mfu import mfu_text
from tpu_tuner.metrics.timing import TimingStats

# How the figures are labelled wherever they are shown (summary, report, provenance).
FROM_WINDOW = "steady step, interleaved verification window"
FROM_SEARCH = "steady step, the search's one measurement of each setting"


@dataclass(frozen=True)
class WindowStep:
    """One setting's steady step over the interleaved rounds of the verification (seconds)."""

    median_s: float
    p10_s: float
    p90_s: float
    rounds: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> WindowStep:
        """The median, p10 and p90 of one label's per-round samples."""
        stats = TimingStats.from_samples(samples)
        return cls(stats.median, stats.p10, stats.p90, stats.count)


@dataclass(frozen=True)
class WindowFigures:
    """The baseline's and the best's steps in the verification window."""

    baseline: WindowStep
    best: WindowStep

    @classmethod
    def of(cls, samples: Mapping[str, Sequence[float]]) -> WindowFigures | None:
        """From `Verification.samples` (labels "baseline" and "best"); None when either is missing."""
        if not samples.get("baseline") or not samples.get("best"):
            return None
        return cls(WindowStep.of(samples["baseline"]), WindowStep.of(samples["best"]))


@dataclass(frozen=True)
class ComparedSteps:
    """Baseline and tuned as the summary, report and provenance show them, and where from.

    With a window, each is the search's Measurement with its steady step (median, p10, p90,
    samples) replaced by the window's: compile time, memory, accuracy and FLOPs stay the
    search's, so its amortised step is the window's step + the search's compile time / planned
    steps. Without one, the search's Measurements as they were.
    """

    baseline: Measurement | None
    tuned: Measurement | None
    from_window: bool
    rounds: int = 0  # the window's rounds (0: from the search)
    why_search: str = ""  # why the figures are the search's (empty from a window)

    @property
    def source(self) -> str:
        """Where the steady steps come from, in words (FROM_WINDOW or FROM_SEARCH)."""
        return FROM_WINDOW if self.from_window else FROM_SEARCH

    @property
    def where(self) -> str:
        """Where the steady steps come from, in two or three words (a table row's label)."""
        return "interleaved verification window" if self.from_window else "search"

    @property
    def ratio(self) -> float | None:
        """Baseline step / tuned step: the ratio of the shown medians (None when one is missing)."""
        if self.baseline is None or self.tuned is None or self.tuned.step_median <= 0:
            return None
        return self.baseline.step_median / self.tuned.step_median


def with_window_step(m: Measurement | None, step: WindowStep, samples: Sequence[float] = ()) -> Measurement | None:
    """`m` with its steady step from the window (its MFU is recomputed by the caller, on the run's peak)."""
    if m is None:
        return None
    return replace(
        m,
        step_median=step.median_s,
        step_p10=step.p10_s,
        step_p90=step.p90_s,
        samples=[float(s) for s in samples] or m.samples,
    )


def beyond_spreads(search: Measurement, window: Measurement) -> bool:
    """Whether two measurements of one setting disagree beyond their spreads: their p10-p90
    ranges do not overlap."""
    return not (search.step_p10 <= window.step_p90 and window.step_p10 <= search.step_p90)


def step_disagreement(label: str, search: Measurement | None, window: Measurement | None) -> str | None:
    """Where the search's one measurement of a setting and the window's rounds of it disagree
    beyond their spreads (their p10-p90 ranges do not overlap), which figure stands and why, in
    words; None where they agree or one is missing. MFU figures are of the same peak (`window`'s)."""
    if search is None or window is None or search.step_median <= 0 or window.step_median <= 0:
        return None
    if not beyond_spreads(search, window):
        return None
    ratio = window.step_median / search.step_median
    peak = window.peak_flops_per_s
    search_mfu = search.model_flops_per_step / search.step_median / peak if peak > 0 else float("nan")
    said = f"; the search's measurement noted: {'; '.join(search.warnings)}" if search.warnings else ""
    return (
        f"The {label}'s steady step disagrees between the search ({search.step_median * 1e3:.4g} ms, p10-p90 "
        f"{search.step_p10 * 1e3:.4g}-{search.step_p90 * 1e3:.4g}) and the window ({window.step_median * 1e3:.4g} "
        f"ms, {window.step_p10 * 1e3:.4g}-{window.step_p90 * 1e3:.4g}): the window's is {ratio:.2f}x the "
        f"search's, beyond both spreads (MFU {mfu_text(search_mfu)} in the search, {mfu_text(window.mfu)} in the "
        "window). The window's figure stands: "
        "it timed the settings in turn, each in a process started as the search's trial was, under the same "
        f"conditions; the search's was one measurement at its own moment{said}."
    )


__all__ = [
    "FROM_SEARCH",
    "FROM_WINDOW",
    "ComparedSteps",
    "WindowFigures",
    "WindowStep",
    "beyond_spreads",
    "step_disagreement",
    "with_window_step",
]
