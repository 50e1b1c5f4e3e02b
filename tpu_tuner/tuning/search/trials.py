"""The tuner's trials on the studies' one ask/tell loop (studies/loop.py).

A trial holds one setting of the search space. The loop settles claims (repeats, settings
another worker is measuring, trials past the budget); this module says how each of those is
recorded, how the agents turn a setting away, how a claim is measured in the trial worker, and
what the run reports as it goes.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from dataclasses import InitVar, dataclass, replace
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tpu_tuner.core.failures import MEASURED_AGAIN, FailureKind
from tpu_tuner.core.units import duration
from tpu_tuner.devices import backend_class
from tpu_tuner.execution.measurement import EarlyStop
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.runner.ranked_runner import Runner
from tpu_tuner.runner.requests import MeasureRequest
from tpu_tuner.studies import records
from tpu_tuner.studies.coverage import covered_settings, setting_key
from tpu_tuner.studies.liveness import RunningWatch, Worker
from tpu_tuner.studies.loop import Claim, Feature, Rules, Settled, StopReason, run_loop
from tpu_tuner.studies.samplers import ExcludingSampler, PreferringSampler
from tpu_tuner.studies.study_trial import StudyTrial
from tpu_tuner.studies.trial_costs import cost_keys
from tpu_tuner.studies.trial_record import TrialRecord
from tpu_tuner.tuning.agents import Agent
from tpu_tuner.tuning.options.tune_options import TuneOptions
from tpu_tuner.tuning.run.clock import CLOCK, Clock, search_may_go_on, trial_allowance
from tpu_tuner.tuning.run.progress import Progress, ProgressCallback
from tpu_tuner.tuning.search import stacking, trial_attrs
from tpu_tuner.tuning.search.bucketing_context import BucketingContext
from tpu_tuner.tuning.search.environment_blocks import EnvironmentBlocks
from tpu_tuner.tuning.search.failure_learning import FailureLearning, label
from tpu_tuner.tuning.search.memory_limit import MemoryLimit
from tpu_tuner.tuning.search.pruning import HopelessPruner, best_objective
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.search.trial_lines import objective_name, suspected_words, trial_figures
from tpu_tuner.tuning.search.tuning_trial import TuningTrial

log = logging.getLogger(__name__)


def run_search(
    study: optuna.Study,
    space: SearchSpace,
    agents: list[Agent],
    runner: Runner,
    measure_options: MeasureRequest,
    options: TuneOptions,
    emit: ProgressCallback,
    clock: Clock | float,
    bucketing: BucketingContext | None = None,
    memory: MemoryLimit | None = None,
    worker: Worker | None = None,
) -> StopReason:
    """Measure settings until the study holds `options.search.trials` measured ones (counted over
    all its workers), the space is covered, or `options.search.timeout_s` passes; returns which
    (CLOCK: the next trial would eat into the time the finish needs, --time-budget; ASKS: a
    sampler that only re-proposed covered settings).

    `clock` is the run's one clock (a bare start: `as_clock`): --time-budget and --timeout both read it.

    With other workers on the study, a setting another worker is measuring is not measured again
    here, and when their running trials hold the rest of the budget this worker waits for them
    (one may still be lost and queued again) instead of starting more.
    """
    worker = worker or Worker.this_process(None)
    budget = options.search.trials
    assert budget is not None, "the run resolves the budget (search_budget) before the search"
    rules = Rules(
        budget=budget,
        batch=1,
        wait_for_running=True,
        look_between_asks=True,
        max_asks=20 * budget,
        space_size=space.size(),
    )
    feature = TuneTrials(study, space, agents, runner, measure_options, options, emit, clock, bucketing, memory, worker)
    # The sampler never proposes what the study has excluded (ExcludingSampler redraws); the
    # study's pruner is the one the trials are stopped by (should_prune asks it).
    sampler, pruner = study.sampler, study.pruner
    # Within that, it keeps to the trial worker's start-up environment for a block (environment_blocks.py).
    preferring = PreferringSampler(sampler, feature.blocks.preferred)
    study.sampler = ExcludingSampler(preferring, lambda setting: feature.learning.excluded_by(setting) is not None)
    study.pruner = feature.pruner or optuna.pruners.NopPruner()
    try:
        end = run_loop(study, feature, rules, worker, RunningWatch(2 * options.runner.trial_timeout_s + 60))
    finally:
        study.sampler, study.pruner = sampler, pruner
    if end.reason in (StopReason.COVERED, StopReason.ASKS):
        log.info(
            "stopping: %d of %d settings of the space covered",
            len(covered_settings(study.get_trials(deepcopy=False))),
            rules.space_size,
        )
    return end.reason


@dataclass(frozen=True)
class TrialRun:
    """What evaluating a claim gave: its candidate, and an agent's rejection or the worker's outcome."""

    candidate: Candidate
    rejection: str | None = None  # an agent's, or the clock's ("clock: ..."): never measured to the end
    outcome: Any = None
    wall_s: float | None = None  # what a trial the clock stopped ran for


@dataclass(eq=False)
class TuneTrials(Feature):
    """The tuner's side of the loop: one setting a trial, measured one at a time in the warm
    trial worker; a rejection by an agent costs no budget. It keeps the run's clock as `clock`."""

    study: optuna.Study
    space: SearchSpace
    agents: list[Agent]
    runner: Runner
    measure_options: MeasureRequest
    options: TuneOptions
    emit: ProgressCallback
    run_clock: InitVar[Clock | float]  # kept as `clock` (a bare start: `as_clock`)
    bucketing: BucketingContext | None
    memory: MemoryLimit | None
    worker: Worker

    def __post_init__(self, run_clock: Clock | float) -> None:
        self.clock = as_clock(run_clock, self.options)
        self.told: set[int] = set()  # failed trials the agents have heard of
        self.learning = FailureLearning(self.space, self.options.objective.tolerance)
        self.blocks = EnvironmentBlocks(self.space)  # the worker's start-up environment, kept a block
        # A trial's expected step under its own buckets is no amortised step: no pruning with buckets.
        self.pruner = HopelessPruner() if self.options.search.prune and self.bucketing is None else None
        self.stop_above_s: float | None = None  # the pruner's threshold, read each round
        self.out_of_time = False
        self.seen: Sequence[TuningTrial] = ()  # the study's trials as the loop last read them (`observe`)
        self.stacked = False  # whether this worker queued the seeds' winners stacked (stacking.py)
        # The best feasible objective so far, for progress lines: from the loop's read of the
        # study (`observe`) and this worker's tells, not a read of the study a line.
        self.best: float | None = None

    def begin(self, trial: optuna.Trial) -> tuple[Hashable, Any] | None:
        params = self.space.suggest(trial)
        # After the suggest: other workers see the setting and its claim before it is measured.
        trial_attrs.record_claim(trial, self.worker.id, self.worker.host)
        cause = self.learning.excluded_by(params)
        if cause is not None:
            # Never measured: the study knows it fails. Infeasible to the sampler, so TPE moves away.
            TrialRecord.of(trial).write({records.EXCLUDED_BY: cause.key})
            trial.set_constraint("excluded", 1.0)
            self.study.tell(trial, state=TrialState.PRUNED)
            log.debug("%s: excluded (%s), not measured", self._label(trial), cause.describe(label))
            return None
        return setting_key(params), params

    def key_of(self, trial: FrozenTrial) -> Hashable:
        return setting_key(trial.params)

    def setting_written(self, trial: FrozenTrial) -> bool:
        return StudyTrial.of(trial).claims.worker is not None  # the claim follows the last parameter (begin)

    def settled(self, trials: Sequence[FrozenTrial]) -> dict[Hashable, FrozenTrial]:
        return covered_settings(trials)  # type: ignore[return-value]  # dict is invariant: SettingKey keys are Hashable

    def spends(self, trial: FrozenTrial) -> bool:
        read = StudyTrial.of(trial)  # the loop's keys only: no measurement to parse
        refused = read.failure_kind == FailureKind.WOULD_NOT_FIT  # refused unmeasured
        return read.rejected_by is None and read.excluded_by is None and not refused

    def tell_settled(self, trial: optuna.Trial, how: Settled, other: FrozenTrial | None) -> None:
        if how is Settled.REPEAT and other is not None:
            trial_attrs.copy_attrs(other, trial, self.options.objective.tolerance)
            self.study.tell(trial, other.value if other.state == TrialState.COMPLETE else None, state=other.state)
            log.debug("%s: repeat of trial %d, not re-measured", self._label(trial), other.number)
        elif how is Settled.IN_FLIGHT and other is not None:
            # Two workers asked for the same setting at once (TPE's lie about running trials makes
            # it rare): the lower trial number measures it.
            TrialRecord.of(trial).write({records.REPEAT_OF: other.number, records.IN_FLIGHT_ELSEWHERE: True})
            self.study.tell(trial, state=TrialState.PRUNED)
            log.debug("%s: being measured by trial %d of another worker", self._label(trial), other.number)
        else:
            TrialRecord.of(trial).write({records.OVER_BUDGET: True})
            self.study.tell(trial, state=TrialState.PRUNED)
            log.debug("%s: released, earlier trials hold the rest of the budget", self._label(trial))

    def evaluate(self, claims: list[Claim]) -> list[TrialRun]:
        return [self._evaluate(claim) for claim in claims]

    def _evaluate(self, claim: Claim) -> TrialRun:
        candidate = self.space.to_candidate(claim.point)
        rejection = next((f"{a.name}: {r}" for a in self.agents if (r := a.validate(candidate))), None)
        if rejection:
            return TrialRun(candidate, rejection=rejection)
        # The clock is a promise (tuning/run/clock.py): a trial whose compile mode took longer in this
        # search than is left is skipped; any other is stopped where the finish's room begins.
        allowance = trial_allowance(self.seen, self.clock, candidate["execution"])
        if allowance.skip is not None:
            return TrialRun(candidate, rejection=f"{CLOCK}: {allowance.skip}")
        suspects = self.learning.open_suspects_in(claim.point)
        why = f" (to its verdict: {suspected_words(suspects)})" if suspects and self.stop_above_s is not None else ""
        self._progress(f"running {candidate.describe()}{why}", claim.position, trial=claim.trial.number)
        limit = allowance.limit_s
        outcome = self._measure(candidate, stop=not suspects, limit_s=limit)
        if limit is not None and not outcome.ok and outcome.failure.kind == FailureKind.TIMEOUT:
            if limit < self.options.runner.trial_timeout_s:  # the clock's limit, not the trial timeout
                stopped = f"{CLOCK}: stopped after {duration(outcome.seconds)}, where the finish's room begins"
                return TrialRun(candidate, rejection=stopped, wall_s=outcome.seconds)
        return TrialRun(candidate, outcome=outcome)

    def _measure(self, candidate: Candidate, stop: bool = True, limit_s: float | None = None) -> Any:
        """The trial worker's measure job for `candidate` (the one call of it in a search); with
        `stop`, it stops early where the pruner's threshold says it is hopeless."""
        # Start-up variables (TorchTPU eager modes): the backend names them; a trial with any runs
        # in a fresh worker started with them.
        env = self._environment(candidate)
        self.blocks.measured(candidate)
        request = replace(
            self.measure_options,
            candidate=candidate.to_dict(),
            stop_above_s=self.stop_above_s if stop else None,
            planned_steps=self.options.objective.planned_steps,
            **(self.memory.request_fields() if self.memory is not None else {}),  # refused over it, unmeasured
        )
        timeout = None if limit_s is None else min(limit_s, self.options.runner.trial_timeout_s)
        return self.runner.run(request, env=env, timeout_s=timeout)

    def _environment(self, candidate: Candidate) -> dict[str, str]:
        return candidate.environment(backend_class(self.space.device_kind))

    def tell(self, claim: Claim, result: TrialRun) -> None:
        trial, label, objective = claim.trial, result.candidate.describe(), self.options.objective
        if result.rejection is not None:
            ran = {records.TRIAL_WALL_S: result.wall_s} if result.wall_s is not None else {}
            TrialRecord.of(trial).write({records.REJECTED_BY: result.rejection, **ran})
            self.study.tell(trial, state=TrialState.PRUNED)
            # One line for every skip of a compile mode by the clock (tune_progress counts the rest).
            reason = f"{CLOCK} ({result.candidate['execution']})" if result.rejection.startswith(CLOCK) else None
            self._progress(
                f"rejected unmeasured: {label} ({result.rejection})",
                claim.position,
                rejected_by=reason or result.rejection,
                trial=trial.number,
            )
            return
        outcome = result.outcome
        # Stored with the measurement or the failure, in one write (trial_attrs.py).
        TrialRecord.of(trial).update(
            {
                records.MEASURED: True,
                records.TRIAL_WALL_S: outcome.seconds,
                **cost_keys(outcome.value, outcome.seconds, outcome.start_s),
                records.START_ENV: sorted(f"{k}={v}" for k, v in self._environment(result.candidate).items()),
                **({records.HOSTS: list(outcome.hosts)} if outcome.hosts else {}),
            }
        )
        if outcome.ok and isinstance(outcome.value, EarlyStop):
            stop = outcome.value
            # What the worker measured, told to the pruner as Optuna's pruning interface is.
            trial.report(stop.optimistic_s, step=len(stop.steps))
            confirmed = trial.should_prune()
            trial_attrs.record_early_stop(trial, stop, objective.tolerance)
            self.study.tell(trial, state=TrialState.PRUNED)
            if stop.reason == "compile":
                # A compile interrupted midway can leave the compiler's state unusable (a later
                # inductor compile in the same worker hung until its timeout): start afresh.
                self.runner.close()
            note = "" if confirmed else " (the best so far moved on meanwhile)"
            message = f"{label}: stopped early, {stop.message}{note}"
        elif outcome.ok:
            m, memory = outcome.value, self.memory
            value = trial_attrs.record_measurement(
                trial, m, objective.planned_steps, objective.tolerance, self.bucketing, memory
            )
            self.study.tell(trial, value)
            over = memory.exceeded_by(m.peak_memory_bytes) if memory is not None else None
            verdict = (
                "infeasible (accuracy)"
                if m.accuracy_refused(objective.tolerance)
                else f"infeasible ({over})"
                if over
                else "ok"
            )
            if verdict == "ok" and (self.best is None or value < self.best):
                self.best = value
            message = f"{label}: {trial_figures(value, m, objective.planned_steps, self.bucketing)}, {verdict}"
        elif outcome.failure.kind in MEASURED_AGAIN:
            # Cut short by a lost host or a frozen process (runner/): it measured nothing and says nothing
            # of the setting, so FAIL (TPE ignores it) and queued again, to be measured once.
            trial_attrs.record_failure(trial, outcome.failure)
            self.study.tell(trial, state=TrialState.FAIL)
            self.study.enqueue_trial(dict(trial.params))
            message = f"{label}: {outcome.failure.kind}, queued again ({outcome.failure.message})"
        else:
            trial_attrs.record_failure(trial, outcome.failure)
            # Told as pruned with a violated constraint, not FAIL: TPE reads only complete and
            # pruned trials, and puts an infeasible one among the worst, so it proposes away from it.
            trial.set_constraint("failed", 1.0)
            self.study.tell(trial, state=TrialState.PRUNED)
            message = f"{label}: failed ({outcome.failure.kind}: {outcome.failure.message})"
        self._progress(message, claim.position, trial=trial.number)

    def observe(self, trials: Sequence[FrozenTrial]) -> None:
        """Tell the agents of every failed trial they have not heard of: this worker's, an earlier
        run's, or another worker's (each worker's agents learn from the whole study)."""
        self.seen = TuningTrial.all(trials)  # the loop's read of the study this round, each trial read once
        self.best = best_objective(self.seen)
        for trial in self.seen:
            if trial.failed_to_run and trial.number not in self.told:
                self.told.add(trial.number)
                _tell_agents(self.study, self.agents, self.space, trial)
        for cause in self.learning.update(self.study, self.seen):
            self.emit(
                Progress("learn", cause.describe(label), elapsed=self.clock.elapsed(), time_left=self.clock.left())
            )
        if not self.stacked and (stacked := stacking.stacked_setting(self.study, self.seen, self.space)) is not None:
            self.stacked = True
            self.study.enqueue_trial(stacked, skip_if_exists=True)
            self.emit(
                Progress(
                    "learn",
                    f"queued {self.space.to_candidate(stacked).describe()}: "
                    "the seeds that beat the combined one, stacked",
                    elapsed=self.clock.elapsed(),
                    time_left=self.clock.left(),
                )
            )
        if self.pruner is not None:
            self.stop_above_s = self.pruner.threshold(self.seen)
        self.out_of_time = not search_may_go_on(self.seen, self.clock)

    def stop_reason(self) -> StopReason | None:
        # --timeout on the run's clock too (the loop's own timeout would count on another).
        timeout = self.options.search.timeout_s
        if timeout and self.clock.elapsed() > timeout:
            return StopReason.TIMEOUT
        # A runner whose hosts are gone for good raises here, before the next ask: no trial is
        # left running for a relaunch to find.
        self.runner.check_usable()
        return StopReason.CLOCK if self.out_of_time else None

    def waiting(self, spent: int, running: int) -> None:
        self._progress(
            f"the rest of the budget is running on other workers ({running} trial(s)): waiting for them", spent
        )

    def _progress(self, message: str, position: int, rejected_by: str | None = None, trial: int | None = None) -> None:
        """A search line: `position` in the budget, `trial` the trial's number (Optuna's, as
        report.md, trials.csv and the dashboard number it)."""
        self.emit(
            Progress(
                "trial",
                message,
                position,
                self.options.search.trials,
                self.best,
                self.clock.elapsed(),
                objective_name(self.bucketing),
                self.clock.left(),
                rejected_by,
                trial,
            )
        )

    def _label(self, trial: optuna.Trial) -> str:
        return self.space.to_candidate(dict(trial.params)).describe()


def as_clock(clock: Clock | float, options: TuneOptions) -> Clock:
    """The run's clock as given; a bare start (a `time.perf_counter` reading, from a search run
    without a tuning run: tests, benchmarks) is a clock of the options' budget from it."""
    return Clock(options.search.time_budget_s, clock) if isinstance(clock, int | float) else clock


def _tell_agents(study: optuna.Study, agents: list[Agent], space: SearchSpace, trial: TuningTrial) -> None:
    """Tell every agent that a measured trial failed, and how (`Agent.learn`); the settings they
    ask for to tell what failed are queued next (once: a setting the study holds is skipped)."""
    failure = trial.failure
    if failure is None or failure.kind in MEASURED_AGAIN or trial.rejected_by is not None or trial.is_repeat:
        return
    candidate = space.to_candidate(dict(trial.params))
    for agent in agents:
        for follow_up in agent.learn(candidate, trial.number, failure.kind, failure.message or ""):
            study.enqueue_trial(space.complete(follow_up), skip_if_exists=True)


__all__ = ["TrialRun", "TuneTrials", "as_clock", "run_search"]
