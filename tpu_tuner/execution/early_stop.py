"""When a trial's measurement stops early: hopeless against the best setting so far.

A trial is judged by its amortised step (steady step + compile time / planned steps). Once a few
steps have run, the fastest of them is an optimistic estimate of its steady step (noise only ever
slows a step down), so when even that, with the compile time already spent, is beyond `factor`
times the best objective so far, the rest of the measurement cannot change the verdict. A compile
that alone costs more than that objective over the planned steps cannot pay back either, and is
cut off while it runs (`compile_deadline`). Optuna's pruners decide the same way from a trial's
reported values (tuning/search/pruning.py); this rule runs inside the trial worker, where the steps are.
"""

from __future__ import annotations

import random
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from tpu_tuner.core.units import duration

# Steps seen before the fastest of them is trusted as an optimistic estimate (one step may be
# fast by chance far less often than three in a row are all slow).
MIN_STEPS_TO_JUDGE = 3


@dataclass(frozen=True)
class StopRule:
    """Stop a trial whose optimistic amortised step exceeds `threshold_s` (the best objective so
    far times the pruning factor); `planned_steps` spreads its compile time as the objective does."""

    threshold_s: float
    planned_steps: int

    def optimistic(self, steps: Sequence[float], compile_seconds: float) -> float:
        """The best amortised step these steps still allow: the fastest one, plus the compile."""
        return min(steps) + max(0.0, compile_seconds) / self.planned_steps

    def hopeless(self, steps: Sequence[float], compile_seconds: float) -> bool:
        """Whether at least `MIN_STEPS_TO_JUDGE` steps put the trial beyond the threshold."""
        return len(steps) >= MIN_STEPS_TO_JUDGE and self.optimistic(steps, compile_seconds) > self.threshold_s

    def compile_limit_s(self) -> float:
        """Compile seconds past which the amortised step exceeds the threshold whatever the step."""
        return self.threshold_s * self.planned_steps

    def explain(self, steps: Sequence[float], compile_seconds: float) -> str:
        """Why the trial stopped, with its figures."""
        return (
            f"stopped after {len(steps)} steps: the fastest {duration(min(steps))} + compile "
            f"{duration(compile_seconds)} / {self.planned_steps} steps = "
            f"{duration(self.optimistic(steps, compile_seconds))} amortised, beyond {duration(self.threshold_s)} "
            "(the best so far times the pruning factor)"
        )


class CompileCutOff(BaseException):
    """Raised in the worker's main thread when a compile passes its deadline. A BaseException,
    as KeyboardInterrupt is, so that the compiler's own `except Exception` handlers let it through."""


# After the deadline, the cut-off is raised again about this often (jittered +-50%) until it is
# seen: Python drops an exception that a signal handler raises while a gc callback or a finalizer
# runs (jax registers a gc callback; a compile collects garbage often), and one dropped raise would
# lose the deadline.
RETRY_S = 0.05


@contextmanager
def compile_deadline(seconds: float | None) -> Iterator[None]:
    """Raise `CompileCutOff` in this (main) thread once `seconds` pass, and every `RETRY_S` after
    until it leaves the block; no limit when None, or off the main thread (signals reach the main
    thread only)."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    armed = [True]

    def cut_off(signum: int, frame: object) -> None:
        if armed[0]:
            # The next try at a jittered delay: at a fixed period the tries can lock in step with a
            # periodic gc callback (each dropped raise cuts that callback short) and all land in it.
            signal.setitimer(signal.ITIMER_REAL, random.uniform(0.5, 1.5) * RETRY_S)
            raise CompileCutOff(f"the compile ran past {duration(seconds)}")

    previous = signal.signal(signal.SIGALRM, cut_off)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))
    try:
        yield
    finally:
        while armed[0]:  # a tick landing here raises before the flag is down: try again
            try:
                armed[0] = False
            except CompileCutOff:
                continue
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


StepCheck = Callable[[list[float]], bool]
"""Called with the timed steps so far; True stops the timing (`time_steps`)."""

__all__ = ["MIN_STEPS_TO_JUDGE", "RETRY_S", "CompileCutOff", "StepCheck", "StopRule", "compile_deadline"]
