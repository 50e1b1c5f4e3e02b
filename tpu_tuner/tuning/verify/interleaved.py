"""Interleaved comparison of settings on the warm trial worker: the measuring primitive that the
race and the verification both use (one round a job, so that minutes of comparing report progress).

Settings that need different start-up environments (TorchTPU's eager modes, read once per process)
cannot share a worker: switched inside one process, a TorchTPU DeferAndFuse step measured
0.15-0.23 s alternating where a DeferAndFuse process ran 0.25 s (docs/torchtpu.md, "On a real
chip"). Such settings are compared in processes of their own, each started with its environment,
alternating blocks of rounds between them (docs/tuning.md, "Settings fixed per process").

Settings that cannot be resident together are kept apart the same way: one built step holds its
model, optimizer state and batch on the device until the window ends, so two Llama-class settings
in fp32 with AdamW (about 4.8 GB each, a 12.3 GB step peak) do not fit a 15.7 GiB chip side by
side (the issue's window measured both at ~318 ms, each ~243 / 165 ms alone). Where the
settings' measured peaks add up to more than the device's memory, they run in blocks of their
own, each block building and freeing its steps (`resident_groups`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from tpu_tuner.runner.ranked_runner import Runner
from tpu_tuner.runner.requests import CompareRequest
from tpu_tuner.tuning.options.tune_options import RunnerOptions
from tpu_tuner.tuning.run.clock import MIN_BLOCK_ROUNDS, block_rounds, resident_groups

# (rounds done, rounds in all, running baseline/best ratio)
VerifyProgress = Callable[[int, int, float], None]


def start_environments(candidates: list[dict[str, Any]], device_kind: str | None) -> list[dict[str, str]]:
    """Each candidate's start-up environment on `device_kind` (empty: any process runs it)."""
    if device_kind is None:
        return [{} for _ in candidates]
    from tpu_tuner.devices import backend_class
    from tpu_tuner.knobs.candidate import Candidate

    backend = backend_class(device_kind)
    return [Candidate.from_dict(c).environment(backend) for c in candidates]


class InterleavedWindow:
    """One window of interleaved rounds of `candidates` (0 the baseline, 1 the best), to which
    rounds can be added until the caller `close`s it. On a runner that keeps warm steps each round
    is a job on the same worker (the steps built by the first job kept for the rest); elsewhere
    each `run` is one job that builds the candidates afresh (trials on N ranks). `now` times each
    job (a test's fake clock, else `time.perf_counter`). Where the candidates need processes of
    their own, each block of `block` rounds starts them afresh (`clock.block_rounds`: each block
    pays a start, a build and a warm-up per process)."""

    def __init__(
        self,
        runner: Runner,
        candidates: list[dict[str, Any]],
        trial: RunnerOptions,
        now: Callable[[], float] = time.perf_counter,
        environments: list[dict[str, str]] | None = None,
        block: int = MIN_BLOCK_ROUNDS,
        peaks: list[int | None] | None = None,
        memory_bytes: int | None = None,
        alone: bool = False,
    ) -> None:
        self.runner, self.candidates, self.trial, self.now = runner, candidates, trial, now
        self.block = block
        self.samples: list[list[float]] = [[] for _ in candidates]
        self.compiles: dict[str, int] = {}
        # Wall seconds of each job (each block of rounds, where settings need processes of their
        # own), and how many rounds it ran.
        self.jobs: list[tuple[float, int]] = []
        self._holding = False  # whether the worker keeps built steps for a later job
        # The candidates by start-up environment (`start_environments`), in order of first
        # appearance, split where they cannot be resident together (`resident_groups`).
        environments = environments or [{} for _ in candidates]
        self.groups = (
            [(env, [index]) for index, env in enumerate(environments)]
            if alone
            else resident_groups(environments, peaks or [None for _ in candidates], memory_bytes)
        )
        # Why the settings run in groups of their own, in words (the window's notes); "" in one.
        environment_count = len({tuple(sorted(env.items())) for env in environments})
        self.apart = (
            ""
            if len(self.groups) < 2
            else "groups of their own, each setting alone (re-measured)"
            if alone
            else "processes of their own (their start-up environments differ)"
            if len(self.groups) == environment_count
            else "groups built and freed in turn (their measured peaks add up to more than the device's memory)"
        )

    @property
    def per_process(self) -> bool:
        """Whether the candidates run in groups of their own (start-up environments that differ, or
        steps that cannot be resident together), a block of rounds at a time."""
        return len(self.groups) > 1

    @property
    def rounds(self) -> int:
        return len(self.samples[0])

    @property
    def per_job(self) -> int | None:
        """Rounds a job runs: 1 on a warm runner, a block where the candidates need processes of
        their own, else None (all that are asked, in one job)."""
        if self.per_process:
            return self.block
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
        if self.per_process:
            return self._run_blocks(target)
        env = self.groups[0][0] if self.groups else {}
        while self.rounds < target:
            first = self.rounds
            count = min(self.per_job or rounds, target - first)
            final = last or self.per_job is None  # a job of fresh processes keeps nothing
            final = final and first + count >= target
            builds = not self._holding
            started = self.now()
            outcome = self.runner.run(
                self._request(first, count, last=final),
                env=env,
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

    def _run_blocks(self, target: int) -> str | None:
        """Rounds up to `target` in blocks: each block runs every environment's candidates in a
        process started with it (the runner replaces its worker when the environment changes), a
        block's rounds all in one job; the order of the processes rotates from block to block, so
        no setting always follows another's process."""
        while self.rounds < target:
            first = self.rounds
            count = min(self.block, target - first)
            started = self.now()
            block = first // self.block
            order = self.groups[block % len(self.groups) :] + self.groups[: block % len(self.groups)]
            measured: dict[int, list[float]] = {}
            for env, indices in order:
                outcome = self.runner.run(
                    self._request(first, count, last=True, indices=indices),
                    env=env,
                    timeout_s=self.trial.trial_timeout_s * (len(indices) + count),  # it builds them all
                )
                if outcome.failure is not None:
                    return f"{outcome.failure.kind} in rounds {first + 1}-{first + count}: {outcome.failure.message}"
                measured.update(zip(indices, outcome.value.samples))
                for kind, compiles in outcome.value.compiles_while_comparing.items():
                    self.compiles[kind] = self.compiles.get(kind, 0) + int(compiles)
            self.jobs.append((self.now() - started, count))
            for index, kept in enumerate(self.samples):
                kept.extend(measured[index])
        return None

    def close(self) -> None:
        """Release the steps the worker keeps for this window (a job of no rounds)."""
        if self._holding:
            self._holding = False
            env = self.groups[0][0] if self.groups else {}
            self.runner.run(self._request(self.rounds, 0, last=True), env=env, timeout_s=self.trial.trial_timeout_s)

    def running_ratio(self, rounds: list[int] | None = None) -> float:
        """Geometric mean of the baseline/best ratios of `rounds` (all so far by default)."""
        kept = range(self.rounds) if rounds is None else rounds
        ratios = [math.log(self.samples[0][i] / self.samples[1][i]) for i in kept]
        return math.exp(sum(ratios) / len(ratios)) if ratios else float("nan")

    def _request(self, first: int, rounds: int, last: bool, indices: list[int] | None = None) -> CompareRequest:
        settings = self.trial.trial_settings
        assert settings is not None, "the run resolves the trial settings at its start"
        return CompareRequest(
            candidates=self.candidates if indices is None else [self.candidates[i] for i in indices],
            rounds=rounds,
            first_round=first,
            last=last,
            batch_size=self.trial.batch_size,
            seq_len=self.trial.seq_len,
            warmup_min_steps=settings.warmup_min_steps,
            warmup_max_steps=settings.warmup_max_steps,
        )


def compare_interleaved(
    runner: Runner,
    candidates: list[dict[str, Any]],
    rounds: int,
    trial: RunnerOptions,
    progress: VerifyProgress | None,
    environments: list[dict[str, str]] | None = None,
    peaks: list[int | None] | None = None,
    memory_bytes: int | None = None,
) -> tuple[list[list[float]], dict[str, int]] | str:
    """`rounds` interleaved rounds of `candidates` in one window (`InterleavedWindow`); `trial`:
    the sizes, warm-up and timeout of a trial; `environments`: each candidate's start-up
    environment; `peaks` and `memory_bytes`: what keeps them apart (`resident_groups`). Returns
    per-candidate samples and compile counts, or why it failed."""
    window = InterleavedWindow(
        runner,
        candidates,
        trial,
        environments=environments,
        block=block_rounds(rounds),
        peaks=peaks,
        memory_bytes=memory_bytes,
    )
    step = window.per_job or rounds
    while window.rounds < rounds:
        failure = window.run(min(step, rounds - window.rounds), last=window.rounds + step >= rounds)
        if failure is not None:
            return f"{failure} ({rounds} rounds asked)"
        if progress is not None:
            progress(window.rounds, rounds, window.running_ratio())
    return window.samples, window.compiles
