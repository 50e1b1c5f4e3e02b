"""The progress events a tuning run reports (the CLI prints them; the Python API passes a callback)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Progress:
    """A progress event for whoever shows progress (the CLI prints these)."""

    phase: str  # "profile" | "budget" | "trial" | "learn" | "verify" | "done"
    message: str
    trial: int | None = None
    trials: int | None = None
    # The best feasible objective so far: the same quantity a finished trial's message leads
    # with, named by `objective` ("amortised": steady step + compile time / planned steps).
    best_seconds: float | None = None
    elapsed: float = 0.0
    objective: str = "amortised"
    # Seconds left of the run's time budget (--time-budget); None without one.
    time_left: float | None = None
    # A setting an agent rejected unmeasured: the agent's reason (the CLI counts repeats of one).
    rejected_by: str | None = None
    # The trial's number, as report.md, trials.csv and the dashboard give it (Optuna's); `trial`
    # is its position in the budget.
    number: int | None = None


ProgressCallback = Callable[[Progress], None]

__all__ = ["Progress", "ProgressCallback"]
