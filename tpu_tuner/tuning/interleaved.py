"""Interleaved comparison of settings on the warm trial worker: the measuring primitive that the
race and the verification both use (one round a job, so that minutes of comparing report progress)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from tpu_tuner.runner.ranked_runner import Runner
from tpu_tuner.runner.requests import CompareRequest
from tpu_tuner.tuning.options import RunnerOptions

# (rounds done, rounds in all, running baseline/best ratio)
VerifyProgress = Callable[[int, int, float], None]


class InterleavedWindow:
    """One window of interleaved rounds of `candidates` (0 the baseline, 1 the best), to which
    rounds can be added until the caller `close`s it. On a runner that keeps warm steps each round
    is a job on the same worker (the steps built by the first job kept for the rest); elsewhere
    each `run` is one job that builds the candidates afresh (trials on N ranks). `now` times each
    job (a test's fake clock, else `time.perf_counter`)."""

    def __init__(
        self,
        runner: Runner,
        candidates: list[dict[str, Any]],
        trial: RunnerOptions,
        now: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.runner, self.candidates, self.trial, self.now = runner, candidates, trial, now
        self.samples: list[list[float]] = [[] for _ in candidates]
        self.compiles: dict[str, int] = {}
        # Wall seconds of each job, and how many rounds it ran.
        self.jobs: list[tuple[float, int]] = []
        self._holding = False  # whether the worker keeps built steps for a later job

    @property
    def rounds(self) -> int:
        return len(self.samples[0])

    @property
    def per_job(self) -> int | None:
        """Rounds a job runs: 1 on a warm runner, else None (all that are asked, in one job)."""
        return 1 if self.runner.keeps_warm_steps else None

    def seconds_per_round(self) -> float:
        """What one more round is expected to take: the slowest of the last three jobs a round (a
        job that builds the candidates is the slowest, so the estimate errs long), 0 before any."""
        recent = self.jobs[-3:]
        return max((seconds / rounds for seconds, rounds in recent), default=0.0)

    def run(self, rounds: int, last: bool = False) -> str | None:
        """Add `rounds` rounds (one job a round on a warm runner); `last`: the worker releases the
        built steps after them. Returns why a job failed, else None."""
        target = self.rounds + rounds
        while self.rounds < target:
            first = self.rounds
            count = min(self.per_job or rounds, target - first)
            final = last or self.per_job is None  # a job of fresh processes keeps nothing
            final = final and first + count >= target
            builds = not self._holding
            started = self.now()
            outcome = self.runner.run(
                self._request(first, count, last=final),
                # A job that builds and warms up every candidate is allowed a trial's time for each.
                timeout_s=self.trial.trial_timeout_s * ((len(self.candidates) + count) if builds else 1),
            )
            self.jobs.append((self.now() - started, count))
            if outcome.failure is not None:
                self._holding = False  # a failed job's worker is replaced
                return f"{outcome.failure.kind} in round {first + 1}: {outcome.failure.message}"
            self._holding = self.per_job is not None and not final
            for kept, new in zip(self.samples, outcome.value.samples):
                kept.extend(new)
            for kind, count in outcome.value.compiles_while_comparing.items():
                self.compiles[kind] = self.compiles.get(kind, 0) + int(count)
        return None

    def close(self) -> None:
        """Release the steps the worker keeps for this window (a job of no rounds)."""
        if self._holding:
            self._holding = False
            self.runner.run(self._request(self.rounds, 0, last=True), timeout_s=self.trial.trial_timeout_s)

    def running_ratio(self, rounds: list[int] | None = None) -> float:
        """Geometric mean of the baseline/best ratios of `rounds` (all so far by default)."""
        kept = range(self.rounds) if rounds is None else rounds
        ratios = [math.log(self.samples[0][i] / self.samples[1][i]) for i in kept]
        return math.exp(sum(ratios) / len(ratios)) if ratios else float("nan")

    def _request(self, first: int, rounds: int, last: bool) -> CompareRequest:
        settings = self.trial.trial_settings
        assert settings is not None, "the run resolves the trial settings at its start"
        return CompareRequest(
            candidates=self.candidates,
            rounds=rounds,
            first_round=first,
            last=last,
            batch_size=self.trial.batch_size,
            seq_len=self.trial.seq_len,
            warmup_min_steps=settings.warmup_min_steps,
            warmup_max_steps=settings.warmup_max_steps,
        )


def compare_interleaved(
    runner: Runner, candidates: list[dict[str, Any]], rounds: int, trial: RunnerOptions, progress: VerifyProgress | None
) -> tuple[list[list[float]], dict[str, int]] | str:
    """`rounds` interleaved rounds of `candidates` in one window (`InterleavedWindow`); `trial`:
    the sizes, warm-up and timeout of a trial. Returns per-candidate samples and compile counts,
    or why it failed."""
    window = InterleavedWindow(runner, candidates, trial)
    step = window.per_job or rounds
    while window.rounds < rounds:
        failure = window.run(min(step, rounds - window.rounds), last=window.rounds + step >= rounds)
        if failure is not None:
            return f"{failure} ({rounds} rounds asked)"
        if progress is not None:
            progress(window.rounds, rounds, window.running_ratio())
    return window.samples, window.compiles
