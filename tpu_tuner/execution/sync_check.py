"""Whether a synced step was finished on the device when the clock stopped.

Each timed step ends with the backend's sync (`timer.timed_call`). On a device that defers work
to a materialisation point (TorchTPU's DeferAndFuse), a sync that returns before deferred work is
launched times a step without its work, which the next step then pays: a GPT block read 900 µs in
the search (MFU "100%") and 1.34 ms in the verification window (docs/torchtpu.md, "On a real
chip"). The check times the same steps back to back with one sync at the end: that total holds
the work of every step but what the last one still defers past that sync, so a step's work is
read at least 4/5 right however the per-step sync behaves. Back to back never runs slower per step than
synced steps do (it only saves the syncs' round trips), so a back-to-back step clearly slower
than the synced median says the synced ones missed work; their figures are then scaled to the
back-to-back step, and the measurement says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpu_tuner.core.units import duration
from tpu_tuner.devices.base import Backend
from tpu_tuner.metrics.timing import TimingStats

# Steps run back to back: enough that the one sync's round trip is a small part of them.
BACK_TO_BACK_STEPS = 5
# A back-to-back step this much slower than the synced median is beyond any noise a steady
# device shows between two runs of the same step (the chip's decoder: 0.241 s back to back,
# 0.246-0.249 s synced); below it, the synced figures stand.
MISSED_WORK_RATIO = 1.15


@dataclass(frozen=True)
class SyncCheck:
    """The synced median step and the back-to-back one (seconds per step), and their verdict."""

    synced_s: float
    back_to_back_s: float
    steps: int

    @property
    def missed_work(self) -> bool:
        """Whether the synced steps ended before the device finished their work."""
        return self.back_to_back_s > MISSED_WORK_RATIO * self.synced_s

    @property
    def scale(self) -> float:
        """What the synced steps are multiplied by to hold their work (1 where they did)."""
        return self.back_to_back_s / self.synced_s if self.missed_work else 1.0

    def note(self, what: str = "the step") -> str:
        """The finding in words, for a measurement's warnings."""
        return (
            f"{what} was timed before the device finished: {self.steps} steps back to back took "
            f"{duration(self.back_to_back_s)} each against a synced median of {duration(self.synced_s)} "
            f"({self.back_to_back_s / self.synced_s:.2f}x), so the sync returned with work still deferred; "
            "its steps are scaled to the back-to-back figure"
        )


def needs_check(backend: Backend, flops_per_step: float, median_s: float, peak_flops_per_s: float) -> bool:
    """Whether to check the sync: on a device that may defer work past it, or wherever a step
    ran faster than the device's peak allows (a timing that cannot be right)."""
    beats_peak = median_s > 0 and peak_flops_per_s > 0 and flops_per_step / median_s > peak_flops_per_s
    return backend.defers_work or beats_peak


def check_sync(run: Callable[[], Any], backend: Backend, synced_median_s: float) -> SyncCheck:
    """Run `BACK_TO_BACK_STEPS` steps with one sync at the end, against `synced_median_s`."""
    backend.synchronize_ranks()
    start = time.perf_counter()
    for _ in range(BACK_TO_BACK_STEPS):
        run()
    backend.synchronize_ranks()
    total = backend.max_over_ranks(time.perf_counter() - start)
    return SyncCheck(synced_median_s, total / BACK_TO_BACK_STEPS, BACK_TO_BACK_STEPS)


def finished_timing(
    run: Callable[[], Any], backend: Backend, timing: TimingStats, flops: float, peak: float
) -> tuple[TimingStats, list[str]]:
    """`timing`, scaled to steps run back to back where its synced steps ended before the device
    finished their work (checked where `needs_check` says); and that finding, in words."""
    if not needs_check(backend, flops, timing.median, peak):
        return timing, []
    sync = check_sync(run, backend, timing.median)
    if not sync.missed_work:
        return timing, []
    return TimingStats.from_samples([s * sync.scale for s in timing.samples]), [sync.note()]
