"""The user's clock: a run that fits its time budget, search, race and verification together.

The budget counts from the run's start (loading and profiling the model are in it). The search
stops starting trials once the next one (as long as the trials so far took, at the median) would
eat into what the race and the verification need, estimated from the measured settings
themselves: each setting compared is built and warmed up once (its compile, a few steps) and then
runs one step a round. When less time is left than the full finish needs, the finish shrinks in
the order that costs the claim least: fewer leaders raced, then no race, then no knob-by-knob
contributions (each reverted knob is a setting compiled afresh), then fewer
verification rounds (never under `MIN_VERIFY_ROUNDS`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from optuna.trial import TrialState

from tpu_tuner.core.units import duration
from tpu_tuner.tuning.search.tuning_trial import TuningTrial, WallTimeSplit

MIN_VERIFY_ROUNDS = 4
WARMUP_STEPS = 3  # steps a compared setting runs before its first timed round (about warm_up's minimum)
# A setting compared after the search compiles again, mostly from the compiler's cache: on
# examples/gpt.py a graph compiled cold in 15.1 s compiled again in 0.8 s. A third is a margin.
RECOMPILE_SHARE = 0.3
# What the search keeps room for: a race of a few leaders and a short verification without the
# knob-by-knob contributions (the finish then takes the fullest plan the time left allows).
RESERVED_RACE_TOP = 3
RESERVED_VERIFY_ROUNDS = 6
# Where compared settings need processes of their own (TorchTPU's eager modes), a window alternates
# blocks of rounds between their processes, each block starting every process afresh: two blocks
# (one ordering, then the other) cancel a drift that is linear in time at the least process
# starts; a Llama-class window of 3 blocks of 4 rounds on a v5e chip (a trial in a fresh worker there:
# 98.8 s beyond compile and steps) ran over its 8-minute clock by more than 2 minutes (docs/torchtpu.md).
PROCESS_BLOCKS = 2
MIN_BLOCK_ROUNDS = 4
# Kept for what follows the verification: the run folder's reports and plots, and the process's
# exit (on examples/gpt.py the last progress line came 5 s before the process ended).
WRAP_UP_S = 10.0
# How a trial the clock turned away or stopped is named (its `rejected_by` starts with it).
CLOCK = "clock"
Env = TypeVar("Env")  # a start-up environment: any value equal for settings that share one


@dataclass
class Clock:
    """The run's time budget (None: no limit) from `started`, a reading of `now` (a test's fake
    clock, else `time.perf_counter`).

    A tuning run makes one (tuning/run/tune_run.py) and hands that one to every phase: the progress
    lines, the search, the race and the verification all read the same budget."""

    budget_s: float | None
    started: float
    now: Callable[[], float] = field(default=time.perf_counter, compare=False, repr=False)

    def set_budget(self, budget_s: float) -> None:
        """The one change a run's clock takes: the default fitted to the device once the profile
        phase has ended (tuning/run/fitted_clock.py). Mutated, not replaced, so that every holder of
        the clock reads the fitted budget from then on."""
        self.budget_s = budget_s

    def elapsed(self) -> float:
        return self.now() - self.started

    def left(self) -> float | None:
        """Seconds left of the budget (never negative), or None without one."""
        return None if self.budget_s is None else max(0.0, self.budget_s - self.elapsed())

    def left_to_work(self) -> float | None:
        """Seconds left for measuring: the budget's left less `WRAP_UP_S` for writing the results."""
        left = self.left()
        return None if left is None else max(0.0, left - WRAP_UP_S)


@dataclass(frozen=True)
class FinishPlan:
    """How the run finishes: leaders raced (0: no race), the race's and the verification's
    rounds, whether each knob's contribution is measured, and the seconds it is expected to take."""

    race_top: int
    race_rounds: int
    verify_rounds: int
    ablations: bool
    seconds: float

    def describe(self) -> str:
        race = f"race of {self.race_top} leaders ({self.race_rounds} rounds), " if self.race_top else "no race, "
        knobs = "" if self.ablations else ", without knob-by-knob contributions"
        # The rounds planned: a window adds rounds while its interval is undecided, as the clock allows.
        return (
            f"{race}{self.verify_rounds} verification rounds{knobs}: about {duration(self.seconds)} for the "
            "rounds planned, more where the interval has not decided and the clock has room"
        )


def block_rounds(rounds: int) -> int:
    """Rounds a block runs where settings need processes of their own: the planned `rounds` in
    `PROCESS_BLOCKS` blocks, never fewer than `MIN_BLOCK_ROUNDS` a block."""
    return max(MIN_BLOCK_ROUNDS, -(-rounds // PROCESS_BLOCKS))


def resident_groups(
    environments: Sequence[Env], peaks: Sequence[int | None], memory_bytes: int | None
) -> list[tuple[Env, list[int]]]:
    """The candidates (by index) in groups that run in one process together: those of one
    start-up environment, split in order wherever their measured peaks (`peaks`, bytes; None:
    not measured, taken as the largest measured) would add up to more than `memory_bytes` (None:
    no bound). A group's peaks are summed whole, though only one step runs at a time: each built
    step keeps its own weights, optimizer state and batch, and its peak is the bound known. Two
    Llama-class steps kept side by side on a v5e chip ran at ~318 ms each where alone they ran at
    243 and 165 ms (tuning/verify/interleaved.py)."""
    largest = max((p for p in peaks if p is not None), default=0)
    sizes = [largest if p is None else p for p in peaks]
    groups: list[tuple[Env, list[int]]] = []
    for index, env in enumerate(environments):
        same = [g for g in groups if g[0] == env]
        group = same[-1] if same else None
        load = sum(sizes[i] for i in group[1]) if group else 0
        if group is None or (memory_bytes is not None and load + sizes[index] > memory_bytes):
            groups.append((env, [index]))
        else:
            group[1].append(index)
    return groups


@dataclass(frozen=True)
class _Setting:
    step_s: float
    compile_s: float
    env: tuple[str, ...] = ()  # its start-up environment (`records.START_ENV`): equal ones share a process
    block: int = 1  # steps of one timed sample (execution/timer.py): a round runs a block of each setting
    peak: int | None = None  # its measured peak memory, bytes
    memory: int | None = None  # the study's memory limit its trial was judged under, bytes

    @property
    def round_s(self) -> float:
        """What one round of the window spends on it."""
        return self.step_s * self.block

    def build_s(self, cached: bool = True) -> float:
        """Building and warming it up again: its compile mostly from the cache when the search
        compiled this very setting, in full when not (a knob reverted makes a new setting)."""
        return (RECOMPILE_SHARE if cached else 1.0) * self.compile_s + WARMUP_STEPS * self.step_s


def _measured(trials: Sequence[TuningTrial]) -> list[tuple[TuningTrial, _Setting]]:
    found = []
    for trial in trials:
        step = trial.step_median_s
        if step is not None and trial.is_feasible and not trial.is_repeat:
            block = trial.measurement.steps_per_sample if trial.measurement is not None else 1
            compile_s = trial.compile_s or 0.0
            setting = _Setting(
                step, compile_s, trial.start_env, block, trial.peak_memory_bytes, trial.memory_limit_bytes
            )
            found.append((trial, setting))
    return sorted(found, key=lambda pair: pair[0].value if pair[0].value is not None else float("inf"))


def process_seconds(trials: Sequence[TuningTrial]) -> float:
    """What starting a process for a compared setting costs beyond its compile and steps, as the
    search measured it: the median start-up and overhead of the trials that started a worker of
    their own, else the largest overhead of any trial (the first worker's first trial). Less the
    reference's and the baseline's outputs such a trial computed, which a comparing process skips."""
    costs = [t.costs for t in trials]

    def beyond(c: WallTimeSplit) -> float:
        return (c.worker_start_s or 0.0) + max(0.0, (c.overhead_s or 0.0) - (c.reference_s or 0.0))

    fresh = [beyond(c) for c in costs if (c.worker_start_s or 0.0) > 0.0]
    if fresh:
        return statistics.median(fresh)
    return max((beyond(c) for c in costs), default=0.0)


def window_seconds(settings: Sequence[_Setting], rounds: int, process_s: float, cached: Sequence[bool]) -> float:
    """One window of `rounds` rounds of `settings` (`cached[i]`: whether the search compiled
    setting i, so its compile comes mostly from the cache). Settings of one start-up environment
    share a worker: each built once. Of several: `PROCESS_BLOCKS` blocks (fewer where the rounds
    are few), each starting a process per environment and building its settings again, but for
    the process a block's order shares with the last block's (A B, then B A: B's runs on).
    Settings of one environment that do not fit the device's memory together (`resident_groups`)
    run in blocks too, each block building them again in the same worker."""
    steps = rounds * sum(s.round_s for s in settings)
    builds = [s.build_s(c) for s, c in zip(settings, cached)]
    memory = min((s.memory for s in settings if s.memory), default=None)
    groups = resident_groups([s.env for s in settings], [s.peak for s in settings], memory)
    if len(groups) <= 1:
        return sum(builds) + steps
    envs = {s.env for s in settings}
    blocks = -(-rounds // block_rounds(rounds))
    starts = blocks * len(envs) - (blocks - 1) if len(envs) > 1 else 0
    return starts * process_s + blocks * sum(builds) + steps


def finish_seconds(trials: Sequence[TuningTrial], plan: FinishPlan, differing_knobs: int = 3) -> float:
    """Expected seconds of `plan` on the study's measured settings: the baseline (the first
    trial measured) and the best; each knob-reverted setting costs about as much as the best."""
    measured = _measured(trials)
    if not measured:
        return 0.0
    baseline = min(measured, key=lambda pair: pair[0].number)[1]
    leaders = [s for _, s in measured[: max(1, plan.race_top)]]
    best = leaders[0]
    process_s = process_seconds(trials)
    race = 0.0
    if plan.race_top > 1:
        raced = [baseline, *leaders]
        race = window_seconds(raced, plan.race_rounds, process_s, [True] * len(raced))
    # A knob set back is costed as the best, in the best's process (most knobs start none).
    ablated = [best] * differing_knobs if plan.ablations else []
    verified = [baseline, best, *ablated]
    cached = [True, True, *(False for _ in ablated)]
    return race + window_seconds(verified, plan.verify_rounds, process_s, cached)


def plan_finish(
    trials: Sequence[TuningTrial],
    race_top: int,
    verify_rounds: int,
    seconds_left: float | None,
) -> FinishPlan:
    """The fullest finish that fits `seconds_left` (the whole one without a budget)."""
    full = FinishPlan(race_top, max(4, verify_rounds // 2), verify_rounds, True, 0.0)
    fewest = min(MIN_VERIFY_ROUNDS, verify_rounds)
    plans = [full]
    for top in range(race_top - 1, 1, -1):
        plans.append(replace(full, race_top=top))
    plans.append(replace(full, race_top=0))
    # Each knob reverted is a setting never compiled before: the contributions go before rounds.
    plans.append(replace(full, race_top=0, ablations=False))
    for rounds in range(verify_rounds - 2, fewest - 1, -2):
        plans.append(replace(full, race_top=0, verify_rounds=rounds, ablations=False))
    costed = [replace(p, seconds=finish_seconds(trials, p)) for p in plans]
    if seconds_left is None:
        return costed[0]
    return next((p for p in costed if p.seconds <= seconds_left), costed[-1])


def next_trial_seconds(trials: Sequence[TuningTrial]) -> float:
    """What the next trial is expected to take: the median wall time of the measured ones."""
    walls = _walls(trials)
    return statistics.median(walls) if walls else 0.0


def _walls(trials: Sequence[TuningTrial]) -> list[float]:
    """The wall times of the measured trials (a repeat measured nothing)."""
    return [t.costs.wall_s for t in trials if t.costs.wall_s is not None and not t.is_repeat]


def reserved_finish_seconds(trials: Sequence[TuningTrial]) -> float:
    """The room the search keeps for the finish: a race of `RESERVED_RACE_TOP` leaders and
    `RESERVED_VERIFY_ROUNDS` rounds, costed on the measured settings."""
    return finish_seconds(trials, FinishPlan(RESERVED_RACE_TOP, 4, RESERVED_VERIFY_ROUNDS, False, 0.0))


def search_may_go_on(trials: Sequence[TuningTrial], clock: Clock) -> bool:
    """Whether one more trial (as long as the median one so far) fits before the room kept for
    the finish (`reserved_finish_seconds`)."""
    left = clock.left_to_work()
    if left is None or next_trial_seconds(trials) == 0.0:
        return True  # no budget, or nothing measured yet: the baseline is measured whatever the clock
    return left - next_trial_seconds(trials) > reserved_finish_seconds(trials)


def clock_stop_words(trials: Sequence[TuningTrial], clock: Clock) -> str:
    """Why the search stopped for the clock, with its figures (a search that stopped with 44 s
    left and said nothing, issue 55)."""
    left = clock.left()
    return (
        f"search stopped by the clock with {duration(left or 0.0)} left: the next trial (about "
        f"{duration(next_trial_seconds(trials))}, the median so far) would eat into the "
        f"{duration(reserved_finish_seconds(trials))} kept for the race and verification and the "
        f"{duration(WRAP_UP_S)} for writing the results"
    )


def only_baseline_words(trials: Sequence[TuningTrial], clock: Clock | None, budget: int) -> str:
    """The verdict of a search that measured no setting but the baseline: undecided, with what a
    clock that measures `budget` settings would take (never "no gain": nothing was compared)."""
    # The clock is the cause where it turned settings away, or where nothing but the baseline was asked.
    clock_refused = any((t.rejected_by or "").startswith(CLOCK) for t in trials)
    # Settings queued (seeds) but never asked wait in the study: the clock left no room to ask them.
    asked = [t for t in trials if t.state is not TrialState.WAITING]
    only_asked = all(t.measured for t in asked)
    if clock is None or clock.budget_s is None or not (clock_refused or only_asked):
        return (
            "undecided: no setting but the baseline was measured (every other was rejected, excluded or "
            "a repeat); keep the baseline"
        )
    needed = clock.elapsed() + (budget - 1) * next_trial_seconds(trials) + reserved_finish_seconds(trials) + WRAP_UP_S
    return (
        f"undecided: only the baseline fit in {duration(clock.budget_s)}; about {duration(needed)} would measure "
        f"{budget} settings (--time-budget); keep the baseline"
    )


def expected_trial_seconds(trials: Sequence[TuningTrial], execution: str) -> tuple[float, bool]:
    """What a trial of compile mode `execution` is expected to take, and whether that mode was
    seen: the longest wall time of the measured trials of that mode (its compile dominates: a
    max-autotune compile of 112 s against 10 s trials of others), else the median of all."""
    same = _walls([trial for trial in trials if trial.params.get("execution") == execution])
    return (max(same), True) if same else (next_trial_seconds(trials), False)


@dataclass(frozen=True)
class TrialAllowance:
    """What the clock allows the next trial: the seconds it may run before the room kept for the
    finish (None: no clock, or nothing measured yet), or why it is skipped unmeasured."""

    limit_s: float | None = None
    skip: str | None = None


def trial_allowance(trials: Sequence[TuningTrial], clock: Clock, execution: str) -> TrialAllowance:
    """The clock's promise for a trial of compile mode `execution`: skipped when what this search
    saw that mode take does not fit what is left before the finish's room; else allowed that
    much, and stopped there (a mode not seen yet may compile for longer than any seen)."""
    left = clock.left_to_work()
    if left is None or not any(t.measurement is not None for t in trials):
        # No budget, or nothing measured yet (the baseline, or its retry after a lost worker):
        # measured whatever the clock.
        return TrialAllowance()
    room = left - reserved_finish_seconds(trials)
    expected, seen = expected_trial_seconds(trials, execution)
    if seen and expected > room:
        return TrialAllowance(
            skip=f"{execution} trials took up to {duration(expected)} in this search and "
            f"{duration(max(0.0, room))} is left before the room kept for the race and verification"
        )
    return TrialAllowance(limit_s=max(1.0, room))


__all__ = [
    "CLOCK",
    "MIN_VERIFY_ROUNDS",
    "clock_stop_words",
    "Clock",
    "FinishPlan",
    "finish_seconds",
    "next_trial_seconds",
    "only_baseline_words",
    "plan_finish",
    "PROCESS_BLOCKS",
    "block_rounds",
    "process_seconds",
    "window_seconds",
    "TrialAllowance",
    "expected_trial_seconds",
    "reserved_finish_seconds",
    "search_may_go_on",
    "trial_allowance",
]
