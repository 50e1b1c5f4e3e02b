"""Issue 54, item 4: every timed step finished on the device before the clock stops. Fakes of the
two devices seen: one that defers a step's work past its sync and pays it steps later (a step
returns before its work ends), and TorchTPU's DeferAndFuse as measured on a v5e chip, whose sync
waits for launched work (synced 0.246 s, back to back 0.241 s: the synced figures stand)."""

from __future__ import annotations

import pytest

from tpu_tuner.execution import sync_check, timer
from tpu_tuner.execution.sync_check import BACK_TO_BACK_STEPS, check_sync, finished_timing
from tpu_tuner.metrics.timing import TimingStats

WORK_S = 0.100  # the device work of one step
HOST_S = 0.002  # the host's time to issue it


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeDevice:
    """A backend's timing primitives on a fake clock; a subclass decides what a step and a sync cost."""

    defers_work = True

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def synchronize_ranks(self) -> None:
        self.synchronize()

    def max_over_ranks(self, value: float) -> float:
        return value

    def compile_events(self) -> dict[str, int]:
        return {}

    def synchronize(self) -> None:
        raise NotImplementedError

    def step(self) -> None:
        raise NotImplementedError


class PaysLater(FakeDevice):
    """Each step's work is deferred; its sync returns at once; every third step materialises all
    that was deferred (a graph grown to its limit), so two steps in three read the host's time."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.deferred = 0

    def synchronize(self) -> None:
        return None

    def step(self) -> None:
        self.clock.now += HOST_S
        self.deferred += 1
        if self.deferred == 3:
            self.clock.now += 3 * WORK_S
            self.deferred = 0


class DeferAndFuse(FakeDevice):
    """A step's graph is launched at the next step's start (its materialisation point) and runs
    asynchronously; the sync waits for launched work: each synced step pays one step's work."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.busy_until = 0.0
        self.pending = False

    def synchronize(self) -> None:
        self.clock.now = max(self.clock.now, self.busy_until)

    def step(self) -> None:
        if self.pending:  # launch the previous step's graph
            self.busy_until = max(self.busy_until, self.clock.now) + WORK_S
        self.clock.now += HOST_S
        self.pending = True


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(timer.time, "perf_counter", fake)
    monkeypatch.setattr(sync_check.time, "perf_counter", fake)
    return fake


def _synced(device: FakeDevice) -> TimingStats:
    timing, _ = timer.time_steps(device.step, device, 9, 0.0, 9)  # type: ignore[arg-type]
    return timing


def test_a_step_that_returns_before_its_work_ends_is_caught_and_scaled(clock: Clock) -> None:
    device = PaysLater(clock)
    for _ in range(3):  # warm: the deferred count starts from a materialisation
        device.step()
    timing = _synced(device)
    assert timing.median == pytest.approx(HOST_S)  # two steps in three read only the host's time
    check = check_sync(device.step, device, timing.median)  # type: ignore[arg-type]
    assert check.missed_work and check.steps == BACK_TO_BACK_STEPS
    fixed, notes = finished_timing(device.step, device, timing, 1.0, 1e12)  # type: ignore[arg-type]
    # Five steps back to back hold at least one materialisation: the scaled median is a step's work.
    assert WORK_S * 0.5 < fixed.median < WORK_S * 1.5
    assert len(notes) == 1 and "timed before the device finished" in notes[0]


def test_defer_and_fuse_with_a_sync_that_waits_keeps_its_synced_figures(clock: Clock) -> None:
    device = DeferAndFuse(clock)
    device.step()
    timing = _synced(device)
    assert timing.median == pytest.approx(WORK_S, rel=0.05)
    fixed, notes = finished_timing(device.step, device, timing, 1.0, 1e12)  # type: ignore[arg-type]
    assert fixed is timing and notes == []


def test_a_synchronous_device_is_checked_only_when_a_step_beats_the_peak(clock: Clock) -> None:
    device = PaysLater(clock)
    device.defers_work = False
    timing = TimingStats.from_samples([HOST_S] * 5)
    fixed, notes = finished_timing(device.step, device, timing, 1.0, 1e12)  # type: ignore[arg-type]
    assert fixed is timing and notes == [] and clock.now == 0.0  # not checked: nothing ran
    # 1 GFLOP in 2 ms is 500 GFLOP/s, above a 100 GFLOP/s peak: that timing cannot be right.
    fixed, notes = finished_timing(device.step, device, timing, 1e9, 1e11)  # type: ignore[arg-type]
    assert clock.now > 0 and len(notes) == 1
