"""Every step timed to its result: warm-up until compilation is done, then blocks of steps run back
to back, each block ended by a host read of a value that depends on its last step's whole work.

A device sync can return before a step's work is done: under TorchTPU's DeferAndFuse,
`torch.accelerator.synchronize()` returned with work still deferred, so a step read 148 ms synced
and 199 ms run back to back (docs/torchtpu.md, "On a real chip"). No sync is trusted here: a block
ends when the host holds a number computed from the block's *result* (a training step's updated
parameters, an inference step's output: `execution/step.py`, `result_read`), which no device can
hand over before the work it depends on is done. Work a block leaves deferred past its own read
is paid by the next block's, so contiguous blocks add up to their steps' work; a block's seconds
divided by its steps is one sample. Where the host can queue steps ahead of the device
(`Backend.runs_ahead`), a block is long enough (`TARGET_BLOCK_S`) that the read's round trip is
a small share of it; elsewhere (a CPU) a block is one step with no read, as a CPU step's return is
already its end (the figures CPU runs had before).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpu_tuner.devices.base import Backend
from tpu_tuner.execution.early_stop import StepCheck
from tpu_tuner.metrics.timing import TimingStats

# A block of steps lasts at least this long where the device runs behind the host: the read's
# round trip (under a millisecond) is then under 1% of it. Bounded so that a block of
# microsecond steps stays a few hundred steps.
TARGET_BLOCK_S = 0.2
MAX_BLOCK_STEPS = 256
# Samples a timing gives at the least, whatever the step count asked: a spread needs a few.
MIN_SAMPLES = 5


def _now() -> float:
    return time.perf_counter()


@dataclass
class StepClock:
    """Times `run` (one step, returning its output) to its result: `read(output)` brings to the
    host a value that depends on the step's whole work. `block` steps make one sample."""

    run: Callable[[], Any]
    read: Callable[[Any], Any]
    backend: Backend
    block: int = 1
    now: Callable[[], float] = _now

    @classmethod
    def of(cls, step: Any, backend: Backend) -> StepClock:
        """The clock of a `PreparedStep` (its `run` and `read`)."""
        return cls(step.run, step.read, backend)

    def seconds(self, steps: int = 1) -> float:
        """Seconds per step of `steps` steps back to back, ended by the read of the last one's
        result where the device may run behind the host (on a CPU the step's return is its end,
        and a read would only add its own cost to a microsecond step), and, as a rank of a
        sharded step, the slowest rank's figure on every rank."""
        self.backend.synchronize_ranks()
        start = self.now()
        output = None
        for _ in range(steps):
            output = self.run()
        if self.backend.runs_ahead:
            self.read(output)
        self.backend.synchronize_ranks()
        return self.backend.max_over_ranks(self.now() - start) / steps

    def sample(self) -> float:
        """One sample: seconds per step of a block."""
        return self.seconds(self.block)

    def fit_block(self, step_s: float) -> int:
        """Set the block from a step's seconds: 1 where the host cannot run ahead of the device,
        else enough steps to last `TARGET_BLOCK_S` (2 at the least: one step's read never closes a
        block alone). The same on every rank (`step_s` is the slowest rank's)."""
        if not self.backend.runs_ahead:
            self.block = 1
        elif step_s <= 0:
            self.block = MAX_BLOCK_STEPS
        else:
            self.block = max(2, min(MAX_BLOCK_STEPS, math.ceil(TARGET_BLOCK_S / step_s)))
        return self.block


@dataclass(frozen=True)
class WarmupResult:
    """The first call (compile and warm-up) timed on its own, then the rest of the warm-up."""

    first_call_seconds: float
    steps: int
    seconds: float
    compiles: dict[str, int]
    settled: bool  # False when the last warm-up step still compiled
    # The warm-up steps after the first call that compiled nothing: steady steps already.
    steady_steps: tuple[float, ...] = ()


def compile_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Compilation events between two snapshots of `Backend.compile_events`."""
    return {key: after.get(key, 0) - before.get(key, 0) for key in after}


def compiled(delta: dict[str, int]) -> bool:
    """Whether a delta of `compile_events` holds a compilation (a dynamo graph or a TPU program)."""
    return delta.get("torch_compile_graphs", 0) > 0 or delta.get("tpu_compilations", 0) > 0


def warm_up(clock: StepClock, min_steps: int, max_steps: int) -> WarmupResult:
    """Run steps, each read to its result, until one runs without compiling and at least
    `min_steps` have run; then fit the clock's block to the steady steps."""
    backend = clock.backend
    start_events = backend.compile_events()
    begin = clock.now()
    first = clock.seconds()
    steps = 1
    settled = False
    steady: list[float] = []
    while steps < max_steps:
        before = backend.compile_events()
        seconds = clock.seconds()
        steps += 1
        settled = not backend.max_over_ranks(float(compiled(compile_delta(before, backend.compile_events()))))
        if settled:
            steady.append(seconds)
        if settled and steps >= min_steps:
            break
    clock.fit_block(min(steady) if steady else first)
    return WarmupResult(
        first_call_seconds=first,
        steps=steps,
        seconds=clock.now() - begin,
        compiles=compile_delta(start_events, backend.compile_events()),
        settled=settled,
        steady_steps=tuple(steady),
    )


def time_steps(
    clock: StepClock,
    min_steps: int,
    min_seconds: float,
    max_steps: int,
    stop: StepCheck | None = None,
) -> tuple[TimingStats, dict[str, int]]:
    """Time at least `min_steps` steps (and `MIN_SAMPLES` blocks of several) and `min_seconds` in
    all, up to `max_steps` where a block allows; `stop`, asked after every block with the samples
    so far, may end the timing sooner (a hopeless trial: early_stop.py).

    Returns the statistics (one sample a block, in seconds per step) and the compilations that
    happened while timing (should be none).
    """
    before = clock.backend.compile_events()
    samples: list[float] = []
    total = 0.0
    min_samples = math.ceil(min_steps / clock.block)
    if clock.block > 1:  # blocks of several steps: still a few samples for a spread
        min_samples = max(MIN_SAMPLES, min_samples)
    most = max(min_samples, max_steps // clock.block)
    while len(samples) < most and (len(samples) < min_samples or total < min_seconds):
        seconds = clock.sample()
        samples.append(seconds)
        total += seconds * clock.block
        # Every rank decides alike: each sees the slowest rank's seconds (`StepClock.seconds`).
        if stop is not None and stop(samples):
            break
    return TimingStats.from_samples(samples), compile_delta(before, clock.backend.compile_events())
