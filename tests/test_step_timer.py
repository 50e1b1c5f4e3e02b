"""Issue 68, item 1: every step timed to its result. On a TPU v5e chip a DeferAndFuse step read
148 ms between two syncs and 199 ms run back to back: the sync returned with work still deferred.
A fake deferred device reproduces that (its sync returns at once; its work runs when a result is
read), and the timer, which ends each block of steps with a host read of the block's result,
times the step at its true cost. The read covers the whole work: a training step's updated
parameters, every one of them, and an inference step's whole output."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tpu_tuner.execution import timer
from tpu_tuner.execution.step import result_read
from tpu_tuner.execution.timer import MIN_SAMPLES, TARGET_BLOCK_S, StepClock, time_steps, warm_up
from tpu_tuner.runner.bucket_jobs import ShapeRunner, probe_shapes

WORK_S = 0.199  # a step's device work
HOST_S = 0.001  # the host's time to issue it


class DeferredDevice:
    """A backend on a fake clock whose sync returns at once and whose work is done only when a
    result is read (and then all that was deferred)."""

    runs_ahead = True

    def __init__(self) -> None:
        self.now = 0.0
        self.deferred = 0.0
        self.reads = 0

    def clock(self) -> float:
        return self.now

    def step(self) -> str:
        self.now += HOST_S
        self.deferred += WORK_S
        return "output"

    def read(self, output: str) -> float:
        assert output == "output"
        self.now += self.deferred
        self.deferred = 0.0
        self.reads += 1
        return 1.0

    def synchronize(self) -> None:
        return None  # returns before the deferred work: what the chip's sync did under DeferAndFuse

    def synchronize_ranks(self) -> None:
        self.synchronize()

    def max_over_ranks(self, value: float) -> float:
        return value

    def compile_events(self) -> dict[str, int]:
        return {}


def _clock(device: DeferredDevice) -> StepClock:
    return StepClock(device.step, device.read, device, now=device.clock)  # type: ignore[arg-type]


def test_a_step_whose_sync_returns_early_is_timed_at_its_true_cost() -> None:
    device = DeferredDevice()
    clock = _clock(device)
    warm = warm_up(clock, 2, 5)
    # Warm-up steps read their results too: each is the step's work, not the host's.
    assert warm.steady_steps and all(s == pytest.approx(WORK_S + HOST_S) for s in warm.steady_steps)
    assert clock.block == 2  # a 0.2 s step already fills a block of `TARGET_BLOCK_S`; two at the least
    timing, compiles = time_steps(clock, 10, 1.0, 200)
    assert timing.median == pytest.approx(WORK_S + HOST_S) and compiles == {}
    assert timing.count >= MIN_SAMPLES and device.reads == warm.steps + timing.count


def test_the_fake_reproduces_what_a_synced_step_read_on_the_chip(monkeypatch: pytest.MonkeyPatch) -> None:
    """Timed between two syncs, as every step was before, the deferred step reads the host's time."""
    device = DeferredDevice()
    start = device.clock()
    device.synchronize()
    device.step()
    device.synchronize()
    assert device.clock() - start == pytest.approx(HOST_S)


def _shape_runner(device: DeferredDevice) -> ShapeRunner:
    """A bucketing probe's runner on the deferred device: its steps at two lengths, its read."""
    runner = object.__new__(ShapeRunner)  # no model: the fake device's steps stand for its steps
    runner.backend, runner.read = device, device.read  # type: ignore[assignment]
    runner._steps = {32: device.step, 64: device.step}
    return runner


def test_the_bucketing_probe_times_each_shape_to_its_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 69, item 1: `tpu-tune buckets` on a chip times a new shape's first step and the warm
    steps it fits t(L) from to their result, as a trial's steps are, never between two syncs."""
    device = DeferredDevice()
    monkeypatch.setattr(timer.time, "perf_counter", device.clock)
    runner = _shape_runner(device)
    assert runner.timed(device.step) == pytest.approx(WORK_S + HOST_S)
    shapes = probe_shapes(runner._steps, runner.timed, device.compile_events)
    assert [s.warm_seconds for s in shapes] == pytest.approx([WORK_S + HOST_S] * 2)


def test_a_replayed_stream_runs_back_to_back_and_is_read_once_at_its_end(monkeypatch: pytest.MonkeyPatch) -> None:
    device = DeferredDevice()
    monkeypatch.setattr(timer.time, "perf_counter", device.clock)
    seconds = _shape_runner(device).stream_seconds([32, 64, 32, 32])
    assert seconds == pytest.approx(4 * (WORK_S + HOST_S)) and device.reads == 1


def test_work_left_deferred_past_a_read_is_paid_by_the_next_block() -> None:
    """A device whose read materialises only the last step's work: the rest is paid at the next
    read, so contiguous blocks still add up to their steps' work."""

    class ReadsLastOnly(DeferredDevice):
        def read(self, output: str) -> float:
            self.now += self.deferred if self.reads else WORK_S  # the first read pays one step
            self.deferred = 0.0 if self.reads else self.deferred - WORK_S
            self.reads += 1
            return 1.0

    device = ReadsLastOnly()
    clock = _clock(device)
    clock.block = 4
    samples = [clock.sample() for _ in range(6)]
    assert samples[0] < WORK_S  # the first block left three steps' work behind
    assert sum(samples) / len(samples) == pytest.approx(WORK_S + HOST_S)  # paid by the second


def test_the_block_fills_its_target_where_the_host_runs_ahead_and_is_one_step_elsewhere() -> None:
    device = DeferredDevice()
    clock = _clock(device)
    assert clock.fit_block(0.010) == round(TARGET_BLOCK_S / 0.010)
    assert clock.fit_block(1.0) == 2
    device.runs_ahead = False
    assert clock.fit_block(0.010) == 1  # a CPU's synced step is already its work


def test_a_cpu_timing_is_the_steps_asked_one_sample_each_without_a_read() -> None:
    """A CPU's step is done when it returns: a read would only add its own cost to the step."""

    class Cpu(DeferredDevice):
        runs_ahead = False

        def step(self) -> str:
            self.now += WORK_S  # synchronous: the work is done when the call returns
            return "output"

    device = Cpu()
    clock = _clock(device)
    clock.fit_block(WORK_S)
    timing, _ = time_steps(clock, 3, 0.0, 3)
    assert timing.count == 3 and timing.median == pytest.approx(WORK_S) and device.reads == 0


def test_a_training_steps_read_depends_on_every_updated_parameter() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    model[2].bias.requires_grad_(False)  # frozen: not the step's work
    read = result_read(model, training=True)
    before = read(None)
    for param in (p for p in model.parameters() if p.requires_grad):
        with torch.no_grad():
            param.view(-1)[-1] += 1.0  # the last element: a read of one element would miss it
        after = read(None)
        assert after != before
        before = after
    with torch.no_grad():
        model[2].bias += 1.0
    assert read(None) == before


def test_an_inference_steps_read_depends_on_its_whole_output() -> None:
    read = result_read(nn.Linear(2, 2), training=False)
    output = {"logits": torch.zeros(2, 3), "ids": torch.tensor([1, 2])}  # a Hugging Face-like output
    first = read(output)
    output["logits"][-1, -1] = 5.0
    assert read(output) != first
    assert read(torch.ones(3)) == pytest.approx(3**0.5)
