"""Warm-up until compilation is done, then timed steps, each synced with the device."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpu_tuner.devices.base import Backend
from tpu_tuner.execution.early_stop import StepCheck
from tpu_tuner.metrics.timing import TimingStats


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


def _compiled(delta: dict[str, int]) -> bool:
    return delta.get("torch_compile_graphs", 0) > 0 or delta.get("tpu_compilations", 0) > 0


def timed_call(step: Callable[[], Any], backend: Backend) -> float:
    """Seconds of one step, synced with the device at both ends (and, as a rank of a sharded
    step, with every rank: the slowest rank's seconds, the same on all of them)."""
    backend.synchronize_ranks()
    start = time.perf_counter()
    step()
    backend.synchronize_ranks()
    return backend.max_over_ranks(time.perf_counter() - start)


def warm_up(step: Callable[[], Any], backend: Backend, min_steps: int, max_steps: int) -> WarmupResult:
    """Run steps until one runs without compiling and at least `min_steps` have run."""
    start_events = backend.compile_events()
    begin = time.perf_counter()
    first = timed_call(step, backend)
    steps = 1
    settled = False
    steady: list[float] = []
    while steps < max_steps:
        before = backend.compile_events()
        seconds = timed_call(step, backend)
        steps += 1
        compiled = _compiled(compile_delta(before, backend.compile_events()))
        settled = not backend.max_over_ranks(float(compiled))  # settled on every rank, or on none
        if settled:
            steady.append(seconds)
        if settled and steps >= min_steps:
            break
    return WarmupResult(
        first_call_seconds=first,
        steps=steps,
        seconds=time.perf_counter() - begin,
        compiles=compile_delta(start_events, backend.compile_events()),
        settled=settled,
        steady_steps=tuple(steady),
    )


def time_steps(
    step: Callable[[], Any],
    backend: Backend,
    min_steps: int,
    min_seconds: float,
    max_steps: int,
    stop: StepCheck | None = None,
) -> tuple[TimingStats, dict[str, int]]:
    """Time at least `min_steps` steps and at least `min_seconds` in all (up to `max_steps`);
    `stop`, asked after every step, may end the timing sooner (a hopeless trial: early_stop.py).

    Returns the statistics and the compilations that happened while timing (should be none).
    """
    before = backend.compile_events()
    samples: list[float] = []
    total = 0.0
    while len(samples) < max_steps and (len(samples) < min_steps or total < min_seconds):
        seconds = timed_call(step, backend)
        samples.append(seconds)
        total += seconds
        # Every rank decides alike: each sees the slowest rank's seconds (timed_call).
        if stop is not None and stop(samples):
            break
    return TimingStats.from_samples(samples), compile_delta(before, backend.compile_events())
