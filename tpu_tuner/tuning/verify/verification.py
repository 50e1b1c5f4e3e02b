"""Honest comparison: the best candidate against the baseline, interleaved in one window.

The search's own timings come from different moments on a machine whose speed drifts, so
they only rank candidates. The claim comes from here: baseline, best, and the best with each
of its knobs reverted run round-robin in one worker, and paired per-round ratios give the
speedup and each knob's contribution with their intervals. Rounds are added while the interval
cannot decide and the clock allows, disturbed rounds are re-run (tuning/verify/verify_window.py), and
the verdict is one of `VerdictKind`. Without a verified win the recommendation is the baseline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import optuna

from tpu_tuner.core.failures import FailureKind
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.metrics.paired import MIN_GAIN, PairedSpeedup, VerdictKind, paired_speedup
from tpu_tuner.metrics.unsteady import Unsteady
from tpu_tuner.runner.ranked_runner import Runner
from tpu_tuner.studies.outcome import TRIED
from tpu_tuner.tuning.agents.base import Agent
from tpu_tuner.tuning.options.tune_options import TuneOptions
from tpu_tuner.tuning.run.clock import (
    MIN_VERIFY_ROUNDS,
    Clock,
    FinishPlan,
    block_rounds,
    finish_seconds,
    only_baseline_words,
    plan_finish,
)
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.search.tuning_trial import TuningTrial, measured_peaks, measured_steps
from tpu_tuner.tuning.verify.interleaved import InterleavedWindow, VerifyProgress, start_environments
from tpu_tuner.tuning.verify.race import RACE_TOP, RaceEntry, leaders, race
from tpu_tuner.tuning.verify.search_agreement import agreed_window
from tpu_tuner.tuning.verify.trim import TRIMMED, KnobContribution, Trim, trim
from tpu_tuner.tuning.verify.verify_window import DecidedWindow, measure_until_decided, window_notes
from tpu_tuner.tuning.verify.window_figures import WindowFigures

log = logging.getLogger(__name__)
# Why a knob's contribution is missing when the clock's finish drops them (tuning/run/clock.py).
NO_TIME = "the time budget left no room (each knob set back is a setting compiled afresh)"
# Why the trimmed setting (tuning/verify/trim.py) is not re-verified in a window of its own.
NO_ROOM = "the time budget left no room for a window of its own"
# How far the window may grow while undecided: without a clock, to 4x --verify-rounds; with one,
# as far as the clock allows (the ceiling only bounds a window of microsecond steps).
UNCLOCKED_GROWTH = 4
CLOCKED_CEILING = 1000


@dataclass(frozen=True)
class DisturbedRound:
    """A round of the window left out by the disturbed-round rule (metrics/disturbed.py) and
    re-run: its number (1-based) and each compared setting's step in it (seconds)."""

    round: int
    steps: dict[str, float]


@dataclass
class Verification:
    """The interleaved re-measurement and the resulting recommendation: the best's window (its
    speedup, samples, figures and knobs' contributions), and the best trimmed of its harmful knobs
    where any was (`trim`, tuning/verify/trim.py)."""

    baseline_trial: int | None
    best_trial: int | None
    chosen: Candidate
    chosen_is_best: bool  # the recommendation is the best itself (not trimmed, not the baseline)
    speedup: PairedSpeedup | None
    contributions: list[KnobContribution] = field(default_factory=list)
    # The knobs of the best whose contribution was not measured, each with why (the clock, an agent
    # refusing the reverted setting); empty in results written before it was recorded.
    contributions_left_out: dict[str, str] = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=dict)
    compiles_while_comparing: dict[str, int] = field(default_factory=dict)
    message: str = ""  # the verdict in words, led by its kind ("verified: ...", "undecided: ...")
    # The search's leaders re-measured interleaved before this verification (tuning/verify/race.py);
    # empty when one leader stood alone. `best_trial` is the race's winner.
    race: list[RaceEntry] = field(default_factory=list)
    # The host whose worker ran this verification (a shared study's trials come from many hosts;
    # the comparison itself is always on one). None for results written before it was recorded.
    host: str | None = None
    # The baseline's and the best's steady steps in this window (tuning/verify/window_figures.py): the figures
    # shown beside the speedup. None when nothing was compared, and in results written before it.
    window: WindowFigures | None = None
    # A `VerdictKind` value; "" in results written before it was recorded (`verdict_kind` derives it).
    verdict: str = ""
    # The window's rounds left out as disturbed (each re-run where the clock allowed); `samples`
    # holds the others.
    disturbed_rounds: list[DisturbedRound] = field(default_factory=list)
    # The settings (and the baseline/best ratio) whose rounds were bimodal or drifting at the last
    # look (metrics/unsteady.py), and the rounds added for them (None: none asked for; 0: no room).
    unsteady: list[Unsteady] = field(default_factory=list)
    unsteady_added: int | None = None
    # The best less the knobs whose contributions lay wholly below 1, and its re-verification;
    # None where no knob was harmful (and in results written before it was recorded).
    trim: Trim | None = None

    @classmethod
    def keeping_baseline(
        cls, baseline: Candidate, message: str, verdict: str = "", trials: tuple[int | None, int | None] = (None, None)
    ) -> Verification:
        """A verification that compared nothing: the baseline is kept, `message` says why; `trials`:
        the baseline's and the best's trial numbers, where the search has them."""
        return cls(*trials, baseline, False, None, message=message, verdict=verdict)

    @property
    def recommends_trimmed(self) -> bool:
        """Whether the recommendation is the best less its harmful knobs (`trim`)."""
        return self.trim is not None and self.trim.recommended

    @property
    def recommends_tuned(self) -> bool:
        """Whether a tuned setting (the best, or the best trimmed) is recommended, not the baseline."""
        return self.chosen_is_best or self.recommends_trimmed

    @property
    def verdict_kind(self) -> VerdictKind:
        """The verdict: as recorded, else (older results) what the speedup and the choice say."""
        if self.verdict:
            return VerdictKind(self.verdict)
        if self.speedup is None:
            same = self.best_trial is not None and self.best_trial == self.baseline_trial
            return VerdictKind.NO_GAIN if same else VerdictKind.NOT_VERIFIED
        return VerdictKind.VERIFIED if self.chosen_is_best else self.speedup.verdict


def verify(
    study: optuna.Study,
    space: SearchSpace,
    runner: Runner,
    options: TuneOptions,
    device_kind: str,
    progress: VerifyProgress | None = None,
    agents: Sequence[Agent] = (),
    clock: Clock | None = None,
    memory_bytes: int | None = None,
    trials: Sequence[TuningTrial] | None = None,
) -> Verification:
    """Re-measure the search's best against the baseline (and each knob reverted, unless an
    agent in `agents` rejects the reverted setting), interleaved; recommend the best only when
    its paired speedup is significant. `progress` hears every round.

    The speedup compares *steady* steps (each candidate is built and warmed up before the first
    round, so compile time is not in it); the search ranked by amortised step. With a `clock` of
    limited time, the race and the rounds are what fits the time left (tuning/run/clock.py).
    Settings whose measured peaks add up to more than `memory_bytes` (the device's memory, or the
    user's limit) are never built side by side (`clock.resident_groups`). `trials`: the study's
    trials as the caller read them at the phase's start (None: read here).
    """
    # Each trial read once (`TuningTrial`): the phase's helpers (the clock, the race, the trim) take these.
    trials = TuningTrial.all(study.get_trials(deepcopy=False)) if trials is None else trials
    measured = [t for t in trials if t.measurement is not None]
    baseline_params = space.baseline_params()
    baseline_trial = next((t for t in measured if t.params == baseline_params), None)
    feasible = [t for t in measured if t.is_feasible]
    baseline = space.to_candidate(baseline_params)
    # The baseline is what the user's code runs and what accuracy is judged against: its own error
    # never keeps it out of the comparison (it fails its guardrail only with outputs not finite, or
    # in a study of an earlier version, which judged it against fp32: TorchTPU's default failed).
    failure = baseline_trial.failure if baseline_trial is not None else None
    kind = failure.kind if failure is not None else None
    if baseline_trial is None or not (baseline_trial.is_feasible or kind == FailureKind.ACCURACY):
        said = failure.message if failure is not None and failure.message is not None else kind
        reason = (
            "the baseline trial did not produce a measurement"
            if baseline_trial is None
            else f"the baseline is infeasible ({said})"
        )
        return Verification.keeping_baseline(baseline, f"not verified: {reason}", VerdictKind.NOT_VERIFIED)
    if not feasible:
        return Verification.keeping_baseline(
            baseline,
            "not verified: no measured setting was feasible, the baseline included; keep the baseline",
            VerdictKind.NOT_VERIFIED,
            (baseline_trial.number, None),
        )
    best_trial = min(feasible, key=lambda t: t.objective)
    others = [t for t in trials if t.params != baseline_params and t.outcome in TRIED]
    if best_trial.params == baseline_params and not others:
        # Nothing was compared: a clock too short for any candidate is no evidence of "no gain".
        words = only_baseline_words(trials, clock, options.search.trials or 1)
        return Verification.keeping_baseline(
            baseline, words, VerdictKind.UNDECIDED, (baseline_trial.number, best_trial.number)
        )
    if best_trial.params == baseline_params:
        return Verification.keeping_baseline(
            baseline,
            "no gain: no feasible candidate beat the baseline in the search; keep the baseline",
            VerdictKind.NO_GAIN,
            (baseline_trial.number, best_trial.number),
        )

    # The search's leaders, raced interleaved: one measurement each cannot order settings a few
    # percent apart (tuning/verify/race.py).
    race_entries: list[RaceEntry] = []
    plan = plan_finish(trials, RACE_TOP, options.objective.verify_rounds, _seconds_left(clock)())
    contenders = leaders(trials, baseline_params)[: plan.race_top]
    if len(contenders) > 1:
        raced = race(trials, space, runner, options, contenders, plan.race_rounds, memory_bytes)
        if isinstance(raced, str):
            log.warning("racing the search's leaders failed (%s); verifying its best by one measurement", raced)
        else:
            best_trial, race_entries = raced

    # What the verification itself can afford once the race is run.
    after_race = _reread(study, trials)
    plan = plan_finish(after_race, 0, options.objective.verify_rounds, _seconds_left(clock)())
    best_params = dict(best_trial.params)
    # A conditional parameter the baseline lacks (inductor's options) differs from its first choice.
    differing = [
        p.name for p in space.searched if best_params.get(p.name, p.choices[0]) != space.baseline_value(p.name)
    ]
    labels = {"baseline": baseline_params, "best": best_params}
    # One knob changed: set back, it is the baseline, already in the window, so it costs nothing.
    attributed = differing if plan.ablations or len(differing) == 1 else []
    unmeasurable = {name: NO_TIME for name in differing if name not in attributed}
    for name in attributed:
        ablated = space.normalize({**best_params, name: space.baseline_value(name)})
        # A reverted setting an agent rejects (fullgraph under DDP once the layout goes back)
        # cannot run: it would fail the whole interleaved comparison, so it is left out.
        refusal = next((r for a in agents if (r := a.validate(space.to_candidate(ablated)))), None)
        if refusal:
            unmeasurable[name] = refusal
        elif ablated != baseline_params:
            labels[f"best without {name}"] = ablated
    unclocked = clock is None or clock.budget_s is None
    compared = [space.to_candidate(params).to_dict() for params in labels.values()]
    now = time.perf_counter if clock is None else clock.now
    growth = UNCLOCKED_GROWTH * options.objective.verify_rounds if unclocked else CLOCKED_CEILING
    settings = list(labels.values())
    decided = agreed_window(
        lambda alone: InterleavedWindow(
            runner,
            compared,
            options.runner,
            now,
            start_environments(compared, device_kind),
            block_rounds(plan.verify_rounds),
            measured_peaks(trials, settings),
            memory_bytes,
            alone,
        ),
        lambda window: measure_until_decided(
            window, plan.verify_rounds, growth, _seconds_left(clock), progress, list(labels)
        ),
        list(labels),
        measured_steps(trials, settings),
        _seconds_left(clock),
        now,
    )
    if isinstance(decided, str):
        return Verification.keeping_baseline(
            baseline,
            f"not verified: the verification failed ({decided}); keep the baseline",
            VerdictKind.NOT_VERIFIED,
            (baseline_trial.number, best_trial.number),
        )
    samples = {label: decided.kept(i) for i, label in enumerate(labels)}
    speedup = decided.speedup
    contributions = [
        KnobContribution(
            name,
            space.baseline_value(name),
            best_params.get(name, space.baseline_value(name)),
            replace(
                paired_speedup(
                    samples.get(f"best without {name}", samples["baseline"]), samples["best"], level=speedup.level
                ),
                overall=speedup.overall,
            ),
        )
        for name in attributed
        if name not in unmeasurable
    ]
    message = verdict_message(decided, options.objective.verify_rounds, unclocked)
    chosen_params = best_params if decided.verdict is VerdictKind.VERIFIED else baseline_params
    verdict = decided.verdict
    trims: list[DecidedWindow] = []  # the trimmed setting's window, where it ran

    def reverify(params: dict[str, Any]) -> DecidedWindow | str:
        pair = [baseline.to_dict(), space.to_candidate(params).to_dict()]
        environments = start_environments(pair, device_kind)
        peaks = measured_peaks(trials, [baseline_params, params])
        window = InterleavedWindow(
            runner, pair, options.runner, now, environments, block_rounds(rounds or 0), peaks, memory_bytes
        )
        again = measure_until_decided(
            window, rounds or 0, growth, _seconds_left(clock), progress, ["baseline", TRIMMED]
        )
        trims.extend([] if isinstance(again, str) else [again])
        return f"its window failed: {again}" if isinstance(again, str) else again

    after_window = _reread(study, after_race)
    rounds = _reverify_rounds(after_window, options.objective.verify_rounds, _seconds_left(clock))
    trimmed = trim(
        contributions,
        best_params,
        baseline_params,
        space.normalize,
        after_window,
        (decided.verdict, message),
        reverify if rounds is not None else None,
        NO_ROOM,
    )
    if trimmed is not None:
        chosen_params, verdict = trimmed.params, trimmed.verdict
        # The trimmed setting's own window's notes (disturbed rounds, unsteady settings), where it ran.
        notes = "".join(window_notes(w) for w in trims).removeprefix("; ")
        message = trimmed.message + (f"; in its own window: {notes}" if notes else "")
    return Verification(
        race=race_entries,
        baseline_trial=baseline_trial.number,
        best_trial=best_trial.number,
        chosen=space.to_candidate(chosen_params),
        chosen_is_best=chosen_params == best_params,
        speedup=speedup,
        contributions=contributions,
        contributions_left_out=unmeasurable,
        samples=samples,
        compiles_while_comparing=decided.compiles,
        message=message,
        window=WindowFigures.of(samples),
        verdict=verdict,
        trim=trimmed.trim if trimmed is not None else None,
        disturbed_rounds=[
            DisturbedRound(i + 1, {label: decided.samples[k][i] for k, label in enumerate(labels)})
            for i in decided.disturbed
        ],
        unsteady=list(decided.unsteady),
        unsteady_added=decided.added_for_unsteady,
    )


def _reread(study: optuna.Study, known: Sequence[TuningTrial]) -> list[TuningTrial]:
    """The study's trials again after a window ran (in a shared study other workers go on adding and
    finishing trials meanwhile): only those new or unfinished when `known` was read are read again,
    since a finished trial's record no longer changes."""
    kept = {t.number: t for t in known if t.finished}
    return [kept.get(t.number) or TuningTrial.of(t) for t in study.get_trials(deepcopy=False)]


def _seconds_left(clock: Clock | None) -> Callable[[], float | None]:
    return (lambda: None) if clock is None else clock.left_to_work


def _reverify_rounds(
    trials: Sequence[TuningTrial], verify_rounds: int, seconds_left: Callable[[], float | None]
) -> int | None:
    """The rounds a window of the trimmed setting against the baseline starts with: the most (down
    to `MIN_VERIFY_ROUNDS`, by twos) the clock has room for, None where it has room for none. The
    trimmed setting may never have been compiled, so it is costed as a knob set back is (in full),
    beside the best (tuning/run/clock.py): an estimate that errs long, as the clock's promise needs."""
    left = seconds_left()
    for rounds in range(verify_rounds, min(MIN_VERIFY_ROUNDS, verify_rounds) - 1, -2):
        if left is None or finish_seconds(trials, FinishPlan(0, 0, rounds, True, 0.0), differing_knobs=1) <= left:
            return rounds
    return None


def verdict_message(decided: DecidedWindow, verify_rounds: int, unclocked: bool) -> str:
    """The verdict in words, led by its kind: "verified: 2.03x (...)", "no gain: ...",
    "undecided: 40 rounds, interval 0.95-1.30 ..."; then the window's notes (`window_notes`)."""
    s, verdict, notes = decided.speedup, decided.verdict, window_notes(decided)
    if verdict is VerdictKind.VERIFIED:
        return f"verified: {s.describe()}{notes}"
    if verdict is VerdictKind.NO_GAIN:
        what = "slower than the baseline when re-measured" if s.ci_high < 1.0 else f"any gain is under {MIN_GAIN:.2f}x"
        return f"no gain: {what}, {s.describe()}{notes}; keep the baseline"
    why = {
        "rounds": f"--verify-rounds allowed no more ({UNCLOCKED_GROWTH}x its {verify_rounds})"
        if unclocked
        else f"the window reached its ceiling of {CLOCKED_CEILING} rounds",
    }.get(decided.stopped_by, "the clock ran out")
    return (
        f"undecided: {len(decided.samples[0])} rounds, interval {s.ci_low:.2f}-{s.ci_high:.2f} "
        f"({s.speedup:.2f}x, {s.stated_level * 100:.4g}%){notes}; {why} before it decided; keep the baseline"
    )


def trial_measurement(study: optuna.Study, number: int | None) -> Any:
    """The stored measurement of trial `number` (None when absent)."""
    if number is None:
        return None
    return TuningTrial.of(study.trials[number]).measurement
