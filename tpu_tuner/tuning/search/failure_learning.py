"""The tuner learns from its failures: which knob values cause them, excluded for the rest of the study.

Every round of the search loop reads the study's measured trials as evidence
(studies/attribution.py): per failure kind, a trial failed with it or got past it. A cause found
is kept in the study itself (a user attribute per cause), so every worker of a shared study and
a resumed run honour it; a setting holding an excluded value is then never measured again
(tuning/search/trials.py tells such an ask without running it). Where two suspects always came
together, a probe (the failing setting with one of them changed back to the nearest setting
that worked) is queued to tell them apart: at most `PROBES_PER_KIND` per failure kind. A setting
holding a value one failure so far points at is measured to its verdict (no early stop): cut
off while compiling, it would spend a trial and settle nothing (a crash model once spent three).
A kind the baseline fails with too is blamed on no value (studies/attribution.py), said once and
kept in the study (`NOT_BLAMED_PREFIX`): its causes, stored before the baseline's verdict came,
are then dropped.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from tpu_tuner.core.failures import MEASURED_AGAIN, WORKER_FAILURES, FailureKind
from tpu_tuner.knobs import registry as knobs
from tpu_tuner.studies import records
from tpu_tuner.studies.attribution import Cause, Evidence, NotBlamed, Probe, Suspect, attribute
from tpu_tuner.studies.coverage import setting_key
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.search.tuning_trial import TuningTrial

log = logging.getLogger(__name__)

PROBES_PER_KIND = 2
# The causes the study holds are read again (a storage transaction) when its trials hold failures
# not seen at the last read (a cause is found from failures: another worker may have stored one)
# and at least this often (seconds); the search read them every round, once a trial.
CAUSES_REREAD_S = 10.0
# The kind of a trial whose compile was cut off (tuning/search/pruning.py): it could never pay back.
COMPILE_COST = "compile_cost"
# The study keeps a kind the baseline fails with too under this prefix + the kind (a study user
# attribute, beside records.EXCLUSION_PREFIX's causes): a stored string, never changed.
NOT_BLAMED_PREFIX = "not_blamed:"


def label(name: str, value: Any) -> str:
    """A knob value in words, as trial labels write it ("autocast bfloat16"), its default too."""
    try:
        words = knobs.get(name).describe(str(value))
    except KeyError:
        words = ""
    return words or f"{name} {value}"


def evidence_of(trials: Sequence[TuningTrial], tolerance: float) -> list[Evidence]:
    """The measured trials as evidence: the failure kind each failed with, and the kinds it got
    past. Rejected, repeated, excluded, lost and interrupted trials measured nothing and say nothing."""
    evidence = []
    for trial in trials:
        kind = trial.failure.kind if trial.failure is not None else None
        if not trial.measured or trial.is_repeat or kind in MEASURED_AGAIN:
            continue  # an interrupted trial (a host lost midway) was measured by nobody
        early = trial.early_stop
        if kind in WORKER_FAILURES:
            outcomes = {kind: True}
        elif early is not None and early.reason == "compile":
            # Cut off while compiling: a compile that cannot pay back is a failure of its own kind.
            outcomes = {COMPILE_COST: True}
        else:
            outcomes = dict.fromkeys((*WORKER_FAILURES, COMPILE_COST), False)
            # What the guardrail judged: the error beyond the baseline's, not the error against fp32
            # (a chip's default precision is itself more than the tolerance from fp32).
            excess = trial.accuracy_excess
            if excess is not None:
                outcomes[FailureKind.ACCURACY] = excess > tolerance
            if early is None:  # a stopped trial's peak memory was not measured
                outcomes[FailureKind.MEMORY] = kind == FailureKind.MEMORY
        evidence.append(
            Evidence(trial.number, dict(trial.params), outcomes, (trial.failure and trial.failure.message) or "")
        )
    return evidence


def describe_kind(kind: str, messages: Sequence[str]) -> str:
    """A failure kind in words, from its failures' messages ("the worker died from SIGSEGV")."""
    if kind == FailureKind.CRASH:
        signals = {m.split("died from ", 1)[1].split()[0] for m in messages if "died from " in m}
        return f"the worker died from {signals.pop()}" if len(signals) == 1 else "the worker crashed"
    if kind == FailureKind.ERROR:
        firsts = {m.splitlines()[0][:80] if m else "" for m in messages}
        return f"the step failed ({firsts.pop()})" if len(firsts) == 1 and "" not in firsts else "the step failed"
    return {
        FailureKind.OOM: "the worker ran out of memory",
        FailureKind.TIMEOUT: "the trial timed out",
        COMPILE_COST: "the compile could not pay back within the planned steps (cut off)",
        FailureKind.ACCURACY: "the accuracy check failed",
        FailureKind.MEMORY: "the peak memory went over the limit",
    }.get(kind, kind)


class FailureLearning:
    """The causes a study has found, and the finding of more; one per search (`TuneTrials`)."""

    def __init__(self, space: SearchSpace, tolerance: float) -> None:
        self.space, self.tolerance = space, tolerance
        self.baseline = space.complete(space.baseline_params())  # trial 0's setting: every first choice
        # The defaults of the searched parameters the baseline lacks (conditional ones): inductor's
        # default options are judged with inductor, not as its rival (studies/attribution.py).
        self.defaults = {p.name: p.choices[0] for p in space.searched if p.name not in self.baseline}
        self.causes: dict[str, Cause] = {}
        self.suspects: list[Suspect] = []  # open values: one failure so far, no success (cut-offs aside)
        self._read: tuple[float, int] | None = None  # when the stored causes were read; failures then
        self._said: set[tuple[str, bool]] = set()  # the kinds blamed on nothing said so far (kind, baseline's)

    def update(self, study: optuna.Study, trials: Sequence[TuningTrial]) -> list[Cause | NotBlamed]:
        """Read the causes the study holds (again when `trials` hold failures not seen at the last
        read, or `CAUSES_REREAD_S` after it) and find new ones in `trials` (stored in the study,
        and probes queued); returns what this worker had not known of, in the order found: causes,
        and kinds blamed on no value (one the baseline fails with too is stored in the study)."""
        evidence = evidence_of(trials, self.tolerance)
        failures, now = sum(1 for e in evidence if any(e.outcomes.values())), time.monotonic()
        found = attribute(evidence, describe_kind, self._alternatives, self.baseline, self.defaults)
        shared = {note.kind for note in found.not_blamed if note.baseline_trial is not None}
        learned: list[Cause | NotBlamed] = []
        if self._read is None or self._read[1] != failures or now - self._read[0] >= CAUSES_REREAD_S:
            self._read = (now, failures)
            for cause in stored_causes(study.user_attrs):
                if cause.key not in self.causes and cause.kind not in shared:
                    self.causes[cause.key] = cause
                    learned.append(cause)
        for note in found.not_blamed:
            if (note.kind, note.baseline_trial is not None) in self._said:
                continue
            self._said.add((note.kind, note.baseline_trial is not None))
            if note.baseline_trial is not None:
                study.set_user_attr(NOT_BLAMED_PREFIX + note.kind, note.to_plain())
            learned.append(note)
        # A cause found (here or by another worker) before the baseline failed with its kind is lifted.
        for key in [key for key, cause in self.causes.items() if cause.kind in shared]:
            log.info("%s no longer excluded: the baseline fails with %s too", key, self.causes.pop(key).kind)
        # A cut-off compile is itself what an early stop makes: no reason to measure one to its end.
        # Single values only: one failure leaves every pair of its values that no success held
        # open (dozens), which would lift the early stop from most settings after any failure.
        self.suspects = [s for s in found.open if s.kind != COMPILE_COST and len(s.values) == 1]
        for cause in found.causes:
            if cause.key not in self.causes:
                self.causes[cause.key] = cause
                study.set_user_attr(records.EXCLUSION_PREFIX + cause.key, cause.to_plain())
                learned.append(cause)
        self._queue_probes(study, trials, found.probes)
        return learned

    def _alternatives(self, name: str, value: Any) -> list[Any]:
        """The other choices of a searched parameter (a probe's values for a conditional one)."""
        return [c for p in self.space.searched if p.name == name for c in p.choices if c != value]

    def excluded_by(self, setting: Mapping[str, Any]) -> Cause | None:
        """The cause that excludes `setting`, or None."""
        return next((cause for cause in self.causes.values() if cause.matches(setting)), None)

    def open_suspects_in(self, setting: Mapping[str, Any]) -> list[Suspect]:
        """The open suspects `setting` holds: measuring it settles them (a success clears one, a
        failure makes it a cause), so it is measured to its verdict, not stopped early."""
        return [suspect for suspect in self.suspects if suspect.matches(setting)]

    def _queue_probes(self, study: optuna.Study, trials: Sequence[TuningTrial], probes: list[Probe]) -> None:
        held = {setting_key(t.params) for t in trials}  # waiting ones too: a probe is queued once
        probes_for = (trial.probe_for for trial in trials)
        queued = Counter(probe_for.get("kind", "") for probe_for in probes_for if isinstance(probe_for, dict))
        for probe in probes:
            setting = self.space.complete(probe.setting)
            if (
                queued[probe.kind] >= PROBES_PER_KIND
                or setting_key(setting) in held
                or self.excluded_by(setting) is not None
            ):
                continue
            dropped = ", ".join(label(n, v) for n, v in probe.dropped)
            kept = ", ".join(label(n, v) for n, v in probe.kept)
            study.enqueue_trial(
                setting,
                user_attrs={
                    records.PROBE_FOR: {
                        "kind": probe.kind,
                        "trial": probe.failing_trial,
                        "question": f"does trial {probe.failing_trial}'s failure ({probe.kind}) need {dropped}, "
                        f"or is {kept} enough?",
                    }
                },
            )
            held.add(setting_key(setting))
            queued[probe.kind] += 1
            log.info("probe queued: trial %d's setting without %s", probe.failing_trial, dropped)


def stored_causes(user_attrs: Mapping[str, Any]) -> list[Cause]:
    """The causes a study holds (its user attributes), in the order they were found; none of a
    kind the baseline fails with too (`stored_not_blamed`)."""
    shared = {note.kind for note in stored_not_blamed(user_attrs)}
    causes = [Cause.from_plain(value) for key, value in user_attrs.items() if key.startswith(records.EXCLUSION_PREFIX)]
    return sorted((c for c in causes if c.kind not in shared), key=lambda cause: (cause.after_trial, cause.key))


def stored_not_blamed(user_attrs: Mapping[str, Any]) -> list[NotBlamed]:
    """The kinds a study blames on no value, as the baseline fails with them too, by kind."""
    notes = [NotBlamed.from_plain(value) for key, value in user_attrs.items() if key.startswith(NOT_BLAMED_PREFIX)]
    return sorted(notes, key=lambda note: note.kind)


__all__ = [
    "NOT_BLAMED_PREFIX",
    "FailureLearning",
    "describe_kind",
    "evidence_of",
    "label",
    "stored_causes",
    "stored_not_blamed",
]
