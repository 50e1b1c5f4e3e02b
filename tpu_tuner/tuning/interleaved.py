"""Interleaved comparison of settings on the warm trial worker: the measuring primitive that the
race and the verification both use (one round a job, so that minutes of comparing report progress)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tpu_tuner.runner.ranked_runner import Runner
from tpu_tuner.runner.requests import CompareRequest
from tpu_tuner.tuning.options import RunnerOptions

# (rounds done, rounds in all, running baseline/best ratio)
VerifyProgress = Callable[[int, int, float], None]


def compare_interleaved(
    runner: Runner, candidates: list[dict[str, Any]], rounds: int, trial: RunnerOptions, progress: VerifyProgress | None
) -> tuple[list[list[float]], dict[str, int]] | str:
    """`rounds` interleaved rounds, one job a round on the same warm worker (the worker keeps the
    built steps between them), so that a comparison of minutes reports its progress; all rounds in
    one job where each job starts fresh processes (trials on N ranks). `trial`: the sizes, warm-up
    and timeout of a trial. Candidate 0 is the baseline, 1 the best. Returns per-candidate samples
    and compile counts, or why it failed."""
    per_job = 1 if runner.keeps_warm_steps else rounds
    samples: list[list[float]] = [[] for _ in candidates]
    compiles: dict[str, int] = {}
    settings = trial.trial_settings
    assert settings is not None, "the run resolves the trial settings at its start"
    for first in range(0, rounds, per_job):
        done = first + per_job - 1
        outcome = runner.run(
            CompareRequest(
                candidates=candidates,
                rounds=per_job,
                first_round=first,
                last=done == rounds - 1,
                batch_size=trial.batch_size,
                seq_len=trial.seq_len,
                warmup_min_steps=settings.warmup_min_steps,
                warmup_max_steps=settings.warmup_max_steps,
            ),
            # The first round builds and warms up every candidate.
            timeout_s=trial.trial_timeout_s * ((len(candidates) + per_job) if first == 0 else 1),
        )
        if outcome.failure is not None:
            return f"{outcome.failure.kind} in round {first + 1} of {rounds}: {outcome.failure.message}"
        for kept, new in zip(samples, outcome.value.samples):
            kept.extend(new)
        for kind, count in outcome.value.compiles_while_comparing.items():
            compiles[kind] = compiles.get(kind, 0) + int(count)
        if progress is not None:
            progress(done + 1, rounds, _running_ratio(samples[0], samples[1]))
    return samples, compiles


def _running_ratio(baseline: list[float], best: list[float]) -> float:
    """Geometric mean of the per-round ratios so far (the estimate paired_speedup gives at the end)."""
    return math.exp(sum(math.log(a / b) for a, b in zip(baseline, best)) / len(baseline))
