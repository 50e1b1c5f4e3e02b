"""The race: the search's few fastest settings re-measured interleaved before one is verified.

The search measures each setting once, at its own moment, on a machine whose timings drift, so
its ranking of settings a few percent apart is partly chance (on examples/gpt.py a run's best by
one measurement, 2 micro-batches at 185 ms, was 7% slower interleaved than 4 micro-batches,
which that run had measured at 200 ms). As racing algorithms do (irace, successive halving), the
leaders get a second, paired look: the baseline and the top settings within `RACE_WITHIN` of the
best run round-robin in one worker, and the fastest by its interleaved amortised step goes on to
the verification. A lone leader (no runner-up within reach) is not raced.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tpu_tuner.metrics.paired import paired_speedup
from tpu_tuner.runner.ranked_runner import Runner
from tpu_tuner.tuning.options.tune_options import TuneOptions
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.search.tuning_trial import TuningTrial, measured_peaks
from tpu_tuner.tuning.verify.interleaved import compare_interleaved, start_environments

# How many of the search's leaders are raced, and how far behind the best one may be: beyond
# 15% one measurement's noise on this kind of machine does not reverse the order. Five: on
# examples/gpt.py five settings sat within 5% of the best by one measurement each, and the one
# fastest interleaved was fifth (docs/search-efficiency.md); each costs a build and one step a round.
RACE_TOP = 5
RACE_WITHIN = 1.15


@dataclass(frozen=True)
class RaceEntry:
    """One raced setting: its trial, the search's figure and the interleaved one."""

    trial: int
    label: str
    search_amortised_s: float
    interleaved_amortised_s: float  # median steady step in the race + the search's compile / planned steps
    speedup_over_baseline: float


def leaders(trials: Sequence[TuningTrial], baseline_params: dict[str, str]) -> list[TuningTrial]:
    """The feasible, measured, non-baseline settings worth racing among the study's `trials`, fastest first."""
    feasible = [
        t
        for t in trials
        if t.is_feasible and t.measurement is not None and not t.is_repeat and t.params != baseline_params
    ]
    feasible.sort(key=lambda t: t.objective)
    if not feasible or any(t.buckets is not None for t in feasible):
        # With varying input lengths the objective is the expected step over the length sample
        # under each trial's own buckets (tuning/search/bucketing_context.py), which a race at one shape cannot
        # re-measure: the search's order stands.
        return []
    return [t for t in feasible[:RACE_TOP] if t.objective <= feasible[0].objective * RACE_WITHIN]


def race(
    trials: Sequence[TuningTrial],
    space: SearchSpace,
    runner: Runner,
    options: TuneOptions,
    contenders: list[TuningTrial],
    rounds: int | None = None,
    memory_bytes: int | None = None,
) -> tuple[TuningTrial, list[RaceEntry]] | str:
    """Race `contenders` (fastest first by the search, of the study's `trials`) against the baseline, interleaved, for
    `rounds` rounds (default: half the verification's, at least 4);
    returns the winner and every entry, or why the race failed (the caller keeps the search's
    best then). Settings whose measured peaks exceed `memory_bytes` together are not built side by
    side (`clock.resident_groups`)."""
    baseline = space.to_candidate(space.baseline_params())
    candidates = [baseline.to_dict()] + [space.to_candidate(dict(t.params)).to_dict() for t in contenders]
    rounds = rounds or max(4, options.objective.verify_rounds // 2)
    settings = [space.baseline_params()] + [dict(t.params) for t in contenders]
    compared = compare_interleaved(
        runner,
        candidates,
        rounds,
        options.runner,
        None,
        start_environments(candidates, space.device_kind),
        measured_peaks(trials, settings),
        memory_bytes,
    )
    if isinstance(compared, str):
        return compared
    samples = compared[0]
    entries = []
    for trial, times in zip(contenders, samples[1:]):
        measured = trial.measurement
        compile_share = measured.compile_seconds / options.objective.planned_steps if measured is not None else 0.0
        median = sorted(times)[len(times) // 2]
        entries.append(
            RaceEntry(
                trial=trial.number,
                label=space.to_candidate(dict(trial.params)).describe(),
                search_amortised_s=trial.objective,
                interleaved_amortised_s=median + compile_share,
                speedup_over_baseline=paired_speedup(samples[0], times).speedup,
            )
        )
    best = min(range(len(entries)), key=lambda i: (entries[i].interleaved_amortised_s, i))
    if not math.isfinite(entries[best].interleaved_amortised_s):
        return "no finite time in the race"
    return contenders[best], entries
