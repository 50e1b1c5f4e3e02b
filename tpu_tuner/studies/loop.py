"""One ask/tell loop for every study tpu-tune searches: the tuner's (one measured trial at a time
in a warm worker) and the planner's (batches of compiles run several at a time).

The loop owns the mechanism that any worker of a study shared by several needs:

* lost trials (a stale heartbeat, or one seen running too long) failed and queued again;
* a budget counted over settled claims and running ones, every worker's;
* claims settled by trial number: a trial whose setting an earlier one has settled is answered
  from it (a repeat), one whose setting an earlier trial is still evaluating is left to it, and
  one asked when earlier trials hold the rest of the budget is released unevaluated;
* caps on asks (a sampler that only proposes what is settled) and on time;
* a heartbeat for every trial from its ask until it is told, and the late result of a trial
  that another worker failed as lost meanwhile dropped.

The feature (`Feature`) says what a trial holds, what it spends, how each of these events is
recorded in the trial, and how a batch of claims is evaluated and told.
"""

from __future__ import annotations

import logging
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tpu_tuner.core.polling import poll
from tpu_tuner.studies.liveness import Heartbeat, RunningWatch, Worker, fail_lost_trials, trial_id_of

log = logging.getLogger(__name__)
SETTING_WAIT_S = 5.0  # a trial's setting is written in milliseconds; past this its worker is gone


@dataclass(frozen=True)
class Rules:
    """When the loop asks, how many at once, and when it stops.

    * ``batch``: claims evaluated together (the planner's compile workers; the tuner's 1).
    * ``wait_for_running``: when running trials hold the rest of the budget, wait for them (one
      may be lost and its setting queued again) rather than stop counting them as spent.
    * ``look_between_asks``: after an ask that makes no claim, look at the study again (lost
      trials, failures, the stop rules) before the next ask, instead of filling the batch on:
      the tuner, one trial at a time, sees the clock and other workers' trials at every ask
    * ``max_asks`` / ``max_idle_asks``: this worker's asks in all / in a row without a claim.
    * ``space_size``: stop once this many distinct settings are settled (with a grid sampler,
      the one way a study walks every setting: the tuner's grid, the planner's grid plan).

    Time is the feature's to keep (`Feature.stop_reason`): one deadline, on the clock the rest of
    its run keeps (the tuner's --time-budget and --timeout), never a second clock here.
    """

    budget: int
    batch: int = 1
    wait_for_running: bool = True
    look_between_asks: bool = False
    max_asks: int | None = None
    max_idle_asks: int | None = None
    space_size: int | None = None


@dataclass(frozen=True)
class Claim:
    """A trial that holds a setting to evaluate: its feature's `point`, the setting's `key`, and
    its `position` in the budget (1-based, as progress lines count)."""

    trial: optuna.Trial
    key: Hashable
    point: Any
    position: int


class StopReason(StrEnum):
    """Why the loop stopped (a `StrEnum`: run.json and the reports keep the word)."""

    BUDGET = "budget"  # spent
    TIMEOUT = "timeout"  # the feature's own limit on the search alone (the tuner's --timeout)
    CLOCK = "clock"  # the feature's own clock (`Feature.stop_reason`: the tuner's --time-budget)
    COVERED = "covered"  # `space_size` settings settled
    ASKS = "asks"  # `max_asks` asked
    IDLE = "idle"  # `max_idle_asks` in a row without a claim


class Holding(Enum):
    """Whether a running trial holds a claim on the budget (`Feature.holds_claim`)."""

    YES = "yes"
    NO = "no"  # it was answered without evaluating (a repeat, released, ruled out)
    DECIDING = "deciding"  # still being read: an earlier trial deciding counts when claims are settled


class Settled(Enum):
    """What became of an asked trial that holds no claim (`settle`; a claim is a `Claim`)."""

    RULED_OUT = "ruled out"  # the feature told it in `begin`
    REPEAT = "repeat"  # answered from the trial that settled its setting
    IN_FLIGHT = "in flight"  # an earlier trial is evaluating its setting
    RELEASED = "released"  # earlier trials hold the rest of the budget
    LOST = "lost"  # another worker failed it as lost before it was evaluated


@dataclass(frozen=True)
class LoopEnd:
    """Why the loop stopped, with what was spent and the asks in a row without a claim then."""

    reason: StopReason
    spent: int
    idle: int


class Feature(ABC):
    """What a feature tells the loop: how trials are asked and read, and how each event is
    recorded. The loop calls these; it never reads or writes a trial attribute itself."""

    def ask(self, study: optuna.Study) -> optuna.Trial:
        """A new trial (define-by-run by default; a feature may pass fixed distributions)."""
        return study.ask()

    @abstractmethod
    def begin(self, trial: optuna.Trial) -> tuple[Hashable, Any] | None:
        """Read a just-asked trial: its setting's key and the feature's point, or None when the
        feature ruled the trial out and told it (it holds no claim)."""

    @abstractmethod
    def key_of(self, trial: FrozenTrial) -> Hashable | None:
        """The setting key a stored trial holds (None: not known yet)."""

    @abstractmethod
    def settled(self, trials: Sequence[FrozenTrial]) -> dict[Hashable, FrozenTrial]:
        """The settings the study has settled, each by the trial that answers its repeats."""

    def spends(self, trial: FrozenTrial) -> bool:
        """Whether a settled trial counts against the budget."""
        return True

    def holds_claim(self, trial: FrozenTrial) -> Holding:
        """Whether a running trial holds a claim on the budget (`Holding`)."""
        return Holding.YES

    def setting_written(self, trial: FrozenTrial) -> bool:
        """Whether a running trial's whole setting is in the storage: its parameters are written one
        by one, and a key read from part of them matches no other trial's."""
        return True

    @abstractmethod
    def tell_settled(self, trial: optuna.Trial, how: Settled, other: FrozenTrial | None) -> None:
        """Record and tell `trial`, settled without a claim: a `Settled.REPEAT` answered from
        `other`, the trial that settled its setting; `Settled.IN_FLIGHT`, its setting evaluated by
        the earlier trial `other`; `Settled.RELEASED` (`other` None), asked when earlier trials
        held the rest of the budget."""

    @abstractmethod
    def evaluate(self, claims: list[Claim]) -> list[Any]:
        """Evaluate a batch of claims; one result each, in order."""

    @abstractmethod
    def tell(self, claim: Claim, result: Any) -> None:
        """Record a claim's result and tell it to the study."""

    def observe(self, trials: Sequence[FrozenTrial]) -> None:
        """See the study's trials before each round of asks (an agent learning of failures); a
        feature that learns nothing from them keeps this default, which does nothing."""
        return None

    def waiting(self, spent: int, running: int) -> None:
        """Running trials of other workers hold the rest of the budget: this worker waits (a hook
        for a progress line; by default nothing)."""
        return None

    def stop_reason(self) -> StopReason | None:
        """Why the feature stops the loop now (its own clock: `StopReason.CLOCK`), or None to go on; asked
        after `observe`, before each round of asks."""
        return None


def run_loop(
    study: optuna.Study, feature: Feature, rules: Rules, worker: Worker, watch: RunningWatch | None = None
) -> LoopEnd:
    """Ask, settle and evaluate trials until `rules` stop the loop; returns why.

    `worker.storage` (None: a study in memory) keeps the trials' heartbeats; `watch` also fails
    trials seen running longer than any trial can run."""
    storage = worker.storage
    asked = idle = 0
    waiting = False
    while True:
        # One read of the whole study a round: the one made after failing lost trials.
        trials = fail_lost_trials(study, storage, watch) if storage is not None else study.get_trials(deepcopy=False)
        feature.observe(trials)
        settled = feature.settled(trials)
        spent = sum(1 for t in settled.values() if feature.spends(t))
        running = [t for t in trials if t.state == TrialState.RUNNING and feature.holds_claim(t) is not Holding.NO]
        if not rules.wait_for_running:
            # Without waiting, running claims are spent as far as this worker can tell.
            spent += sum(1 for t in running if feature.holds_claim(t) is Holding.YES)
        if spent >= rules.budget:
            return LoopEnd(StopReason.BUDGET, spent, idle)
        if (reason := feature.stop_reason()) is not None:
            return LoopEnd(reason, spent, idle)
        if rules.space_size is not None and len(settled) >= rules.space_size:
            return LoopEnd(StopReason.COVERED, spent, idle)
        if rules.max_asks is not None and asked >= rules.max_asks:
            return LoopEnd(StopReason.ASKS, spent, idle)
        if rules.max_idle_asks is not None and idle >= rules.max_idle_asks:
            return LoopEnd(StopReason.IDLE, spent, idle)
        # Running trials hold the rest of the budget, or measure every setting not yet settled
        # (asking then only makes trials answered "in flight elsewhere": 17-309 a chaos study).
        space_held = (
            rules.space_size is not None
            and len(settled.keys() | {feature.key_of(t) for t in running if feature.setting_written(t)})
            >= rules.space_size
        )
        if rules.wait_for_running and (spent + len(running) >= rules.budget or space_held):
            if not waiting:
                feature.waiting(spent, len(running))
                waiting = True
            time.sleep(worker.poll_s)
            continue
        waiting = False
        with ExitStack() as beats:
            batch: list[Claim] = []
            while len(batch) < min(rules.batch, rules.budget - spent):
                if (rules.max_idle_asks is not None and idle >= rules.max_idle_asks) or (
                    rules.max_asks is not None and asked >= rules.max_asks
                ):
                    break
                trial = _ask(study, feature)
                asked += 1
                # Beats from the ask on, so that a worker dying before its trial is told is seen.
                beat = beats.enter_context(ExitStack())
                if storage is not None:
                    beat.enter_context(Heartbeat(storage, trial_id_of(storage, study, trial.number)))
                # Where its setting's writes are refused, beats stopped for a grace period after
                # the ask (a suspended host) and another worker failed it as lost.
                outcome: Claim | Settled = Settled.LOST
                with _unless_failed_elsewhere(study, trial.number, "before it was evaluated here; asking again"):
                    outcome = settle(study, feature, rules, trial, batch)
                if isinstance(outcome, Claim):
                    batch.append(outcome)
                    idle = 0
                    continue
                beat.close()  # told already
                idle += 1
                if outcome is Settled.RELEASED:
                    if not rules.wait_for_running:
                        time.sleep(worker.poll_s)  # the earlier trials settle, or turn out not to
                    break
                if rules.look_between_asks:
                    break
            if not batch:
                continue
            results = feature.evaluate(batch)
            for claim, result in zip(batch, results):
                if storage is not None and _finished_elsewhere(storage, study, claim.trial.number):
                    # Read before telling, so that none of the result is written (a thawed worker).
                    log.warning(
                        "trial %d was failed as lost by another worker while it ran here (its heartbeat "
                        "stopped: this process was frozen or cut off); its result is dropped",
                        claim.trial.number,
                    )
                    continue
                # Where beats stopped for a whole grace period (a suspended host), another worker
                # failed this trial as lost and queued its setting again: its result is dropped.
                with _unless_failed_elsewhere(study, claim.trial.number, "while it ran here; its result is dropped"):
                    feature.tell(claim, result)


def _finished_elsewhere(storage: optuna.storages.BaseStorage, study: optuna.Study, number: int) -> bool:
    """Whether trial `number`, running here, is finished in the storage: another worker failed it as
    lost (its heartbeat stopped for a grace period: this process was stopped, SIGSTOP or a paused
    host) and queued its setting again; telling it would write a second result for that setting."""
    return storage.get_trial(trial_id_of(storage, study, number)).state.is_finished()


@contextmanager
def _unless_failed_elsewhere(study: optuna.Study, number: int, then: str) -> Iterator[None]:
    """Run the block; where it raises because trial `number` was finished by another worker, log
    that, ending with `then`, and go on. A write to such a trial raises `UpdateFinishedTrialError`;
    Optuna's tell, where it reads the trial first (the journal storage), raises ValueError
    ("Cannot tell a FAIL trial")."""
    try:
        yield
    except (optuna.exceptions.UpdateFinishedTrialError, ValueError) as exc:
        elsewhere = isinstance(exc, optuna.exceptions.UpdateFinishedTrialError)
        if not elsewhere and not study.get_trials(deepcopy=False)[number].state.is_finished():
            raise
        log.warning("trial %d was failed as lost by another worker %s", number, then)


def _read_once_settings_written(study: optuna.Study, feature: Feature, number: int) -> list[FrozenTrial]:
    """The study's trials, read once every running trial numbered below `number` has its whole
    setting written (milliseconds after its ask), or after SETTING_WAIT_S: a worker killed mid-suggest
    leaves a partial one until its trial is failed as lost. Without the wait, two workers asking at
    once both measured one setting (the later read the earlier's half-written setting)."""

    def read() -> list[FrozenTrial] | None:
        trials = study.get_trials(deepcopy=False)
        writing = [t for t in trials if t.number < number and t.state == TrialState.RUNNING]
        return None if any(not feature.setting_written(t) for t in writing) else trials

    return poll(read, every_s=0.02, timeout_s=SETTING_WAIT_S) or study.get_trials(deepcopy=False)


def _ask(study: optuna.Study, feature: Feature) -> optuna.Trial:
    with warnings.catch_warnings():
        # Optuna warns that heartbeats are meant for `optimize`; this loop beats itself.
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
        return feature.ask(study)


def settle(
    study: optuna.Study, feature: Feature, rules: Rules, trial: optuna.Trial, batch: list[Claim]
) -> Claim | Settled:
    """The trial's claim, or what became of it.

    The trial's setting and claim are in the storage when it is begun (other workers see them
    before it is evaluated). The study is read again after the ask: another worker
    may have settled this setting (even with a trial asked after this one, while this one's
    setting was being suggested), be evaluating it, or have taken the last of the budget since
    the loop looked. Claims are settled by trial number: the lower number evaluates a setting,
    and takes the budget first."""
    begun = feature.begin(trial)
    if begun is None:
        return Settled.RULED_OUT
    key, point = begun
    trials = _read_once_settings_written(study, feature, trial.number)
    settled = feature.settled(trials)
    earlier = settled.get(key)
    if earlier is not None and earlier.number != trial.number:
        feature.tell_settled(trial, Settled.REPEAT, earlier)
        return Settled.REPEAT
    running_before = [
        t
        for t in trials
        if t.state == TrialState.RUNNING and t.number < trial.number and feature.holds_claim(t) is not Holding.NO
    ]
    elsewhere = next((t for t in running_before if feature.key_of(t) == key), None)
    if elsewhere is not None:
        feature.tell_settled(trial, Settled.IN_FLIGHT, elsewhere)
        return Settled.IN_FLIGHT
    spent = sum(1 for t in settled.values() if feature.spends(t))
    if spent + len(running_before) >= rules.budget:
        feature.tell_settled(trial, Settled.RELEASED, None)
        return Settled.RELEASED
    return Claim(trial, key, point, spent + len(batch) + 1)


__all__ = ["Claim", "Feature", "Holding", "LoopEnd", "Rules", "Settled", "StopReason", "run_loop"]
