"""Which knob values cause a study's failures: evidence from its trials, and the probes that settle
what the evidence leaves open.

A trial here is its setting (parameter -> value) and what became of it for each failure kind:
failed with that kind, got past it (a success for that kind), or tells nothing about it (a crash
tells nothing about accuracy). For a kind, a *suspect* is a value, or a pair of values of two
parameters, that no success holds. A suspect is the cause once

* at least `MIN_FAILURES` failures hold it (one failure may be chance: a flaky host, a lost rank)
  that no cause found first explains (values before pairs, those held by more failures first:
  when every inductor setting fails, a pair seen only in inductor settings is not blamed too),
* no other suspect is held by every failure it is held by (when two values always came together,
  the study cannot tell which one fails: a probe does; meanwhile the pair of them is the cause,
  since a setting holding both fails whichever it is), and
* for a pair, neither value is a suspect alone (a value that fails everywhere is no combination).

The default value of a parameter that only some settings have (a conditional one, inactive in
the baseline: inductor's default options, the default compile scope) is not judged apart from
a value that every failure holding it also holds: a setting naming inductor always has inductor's
defaults too, so as rivals the two would tie, only their pair would be excluded, and further
inductor settings with other options would be measured to settle what the first two failures
showed (a model that crashed under inductor spent a third). Where the options themselves fail (a
non-default one, fullgraph), the tie and its probe stand; where the default options alone fail,
inductor is excluded with them, the price of never measuring a crashing value a third time.

A suspect held by fewer failures is *open*: the next setting holding it settles it (a success
clears it, a failure makes it a cause), so that setting is worth measuring to its verdict.

The probe for two suspects that always came together is the failing setting with one of them
changed back to the value of the nearest setting that worked: whether it fails says which value
is the cause. Deterministic: every worker of a study, given the same trials, finds the same causes.
No Optuna here: the tuner reads its trials into `Evidence` (tuning/search/failure_learning.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

MIN_FAILURES = 2
Value = tuple[str, Any]  # (parameter, value)


@dataclass(frozen=True)
class Evidence:
    """One measured trial: its number, its setting, and per failure kind whether it failed with
    it (True), got past it (False); kinds it tells nothing about are absent."""

    number: int
    setting: Mapping[str, Any]
    outcomes: Mapping[str, bool]
    message: str = ""  # the failure's message, for the words of a cause


@dataclass(frozen=True)
class Cause:
    """A value (or a pair) that causes one failure kind, with the evidence counted when found."""

    values: tuple[Value, ...]
    kind: str
    after_trial: int  # the last trial of the evidence that made it hold
    failures_with: int
    settings_with: int
    failures_without: int
    settings_without: int
    detail: str = ""  # the failures' words ("the worker died from SIGSEGV")

    @property
    def key(self) -> str:
        """A stable name of the cause: the same in every worker ("autocast=bfloat16|execution=...")."""
        return "|".join(f"{name}={value}" for name, value in self.values)

    def matches(self, setting: Mapping[str, Any]) -> bool:
        """Whether `setting` holds every value of the cause."""
        return all(name in setting and setting[name] == value for name, value in self.values)

    def describe(self, label: Callable[[str, Any], str]) -> str:
        """In words, `label` naming each value: "autocast bfloat16 excluded after trial 5: the
        worker died from SIGSEGV in 2 of 2 settings with it, 0 of 3 without"."""
        names = " with ".join(label(name, value) for name, value in self.values)
        what = "the combination " + names if len(self.values) > 1 else names
        return (
            f"{what} excluded after trial {self.after_trial}: {self.detail or self.kind} in {self.failures_with} "
            f"of {self.settings_with} settings with it, {self.failures_without} of {self.settings_without} without"
        )

    def to_plain(self) -> dict[str, Any]:
        return {**asdict(self), "values": [list(v) for v in self.values]}

    @classmethod
    def from_plain(cls, data: Mapping[str, Any]) -> Cause:
        counts = {name: int(data[name]) for name in _COUNTS}
        values = tuple((str(n), v) for n, v in data["values"])
        return cls(values, str(data["kind"]), **counts, detail=str(data.get("detail", "")))


# A cause's counts of trials (`Cause`'s int fields).
_COUNTS = ("after_trial", "failures_with", "settings_with", "failures_without", "settings_without")


@dataclass(frozen=True)
class Probe:
    """A setting worth measuring to tell two suspects apart: `setting` lacks `dropped`, keeps `kept`."""

    setting: dict[str, Any]
    kind: str
    dropped: tuple[Value, ...]
    kept: tuple[Value, ...]
    failing_trial: int


@dataclass(frozen=True)
class Suspect:
    """A value (or a pair) that some failure of `kind` holds and no success does, too few
    failures yet to be the cause (`MIN_FAILURES`): the trials `failures` hold it."""

    values: tuple[Value, ...]
    kind: str
    failures: tuple[int, ...]

    def matches(self, setting: Mapping[str, Any]) -> bool:
        """Whether `setting` holds every value of the suspect."""
        return all(name in setting and setting[name] == value for name, value in self.values)


@dataclass(frozen=True)
class NotBlamed:
    """A failure kind blamed on no value: the baseline (trial `baseline_trial`) fails with it too,
    or (`baseline_trial` None) no setting has got past it yet; `failures` of `settings` failed."""

    kind: str
    after_trial: int
    failures: int
    settings: int
    baseline_trial: int | None = None
    detail: str = ""

    def describe(self, label: Callable[[str, Any], str] | None = None) -> str:
        """In words ("the baseline (trial 0) fails with accuracy too (...): not blamed on any knob
        value, ..."); `label` is unused, as the caller words a `Cause` with it."""
        counts = f"{self.failures} of {self.settings} settings failed with it, up to trial {self.after_trial}"
        if self.baseline_trial is not None:
            return (
                f"the baseline (trial {self.baseline_trial}) fails with {self.kind} too ({self.detail or self.kind}): "
                f"not blamed on any knob value; {counts}"
            )
        return (
            f"{self.kind} in every setting so far ({self.detail or self.kind}): not blamed on any knob value "
            f"until a setting gets past it; {counts}"
        )

    def to_plain(self) -> dict[str, Any]:
        return {**asdict(self), "kind": str(self.kind)}

    @classmethod
    def from_plain(cls, data: Mapping[str, Any]) -> NotBlamed:
        baseline = data.get("baseline_trial")
        return cls(
            str(data["kind"]),
            int(data["after_trial"]),
            int(data["failures"]),
            int(data["settings"]),
            None if baseline is None else int(baseline),
            str(data.get("detail", "")),
        )


@dataclass(frozen=True)
class Attribution:
    """What the evidence says: causes found, probes that would settle tied suspects, the
    suspects still open, and the kinds blamed on no value."""

    causes: list[Cause]
    probes: list[Probe]
    open: list[Suspect] = field(default_factory=list)
    not_blamed: list[NotBlamed] = field(default_factory=list)


Alternatives = Callable[[str, Any], Sequence[Any]]
"""A parameter's other values (`name`, `value` -> choices but `value`), for a probe where the
nearest success lacks the parameter (a conditional one, active only under another's value)."""


def attribute(
    evidence: Sequence[Evidence],
    detail: Callable[[str, Sequence[str]], str] | None = None,
    alternatives: Alternatives | None = None,
    baseline: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> Attribution:
    """The causes of every failure kind in `evidence`, and probes for suspects it cannot separate.
    `detail(kind, messages)` words a kind from its failures' messages. A kind that `baseline` (the
    default setting) fails with, or that no setting got past, is blamed on nothing (`NotBlamed`;
    the latter said from `MIN_FAILURES` failures on, when it could have been blamed). `defaults`
    holds the default value of each parameter the baseline lacks (a conditional one: `_tagalongs`)."""
    causes: list[Cause] = []
    probes: list[Probe] = []
    open_suspects: list[Suspect] = []
    not_blamed: list[NotBlamed] = []
    kinds = sorted({kind for e in evidence for kind, failed in e.outcomes.items() if failed})
    for kind in kinds:
        relevant = [e for e in evidence if kind in e.outcomes]
        failures = [e for e in relevant if e.outcomes[kind]]
        successes = [e for e in relevant if not e.outcomes[kind]]
        words = detail(kind, [e.message for e in failures]) if detail else kind
        shared = [e.number for e in failures if baseline is not None and dict(e.setting) == dict(baseline)]
        if shared or not successes:
            # Blaming needs a setting that got past the kind ("0 of 0 without" is no evidence), and
            # a failure the baseline shares is none against the values it holds.
            if shared or len(failures) >= MIN_FAILURES:
                after = max(e.number for e in relevant)
                first = min(shared) if shared else None
                not_blamed.append(NotBlamed(kind, after, len(failures), len(relevant), first, words))
            continue
        found, open_ties, unsettled = _causes_of(kind, failures, successes, words, defaults or {})
        causes += found
        probes += [p for tie in open_ties if (p := _probe(kind, tie, failures, successes, alternatives)) is not None]
        open_suspects += unsettled
    return Attribution(causes, probes, open_suspects, not_blamed)


def _suspects(
    failures: Sequence[Evidence], successes: Sequence[Evidence], size: int
) -> dict[tuple[Value, ...], set[int]]:
    """Every value (size 1) or pair (size 2) some failure holds and no success does, with the
    failures that hold it."""
    held: dict[tuple[Value, ...], set[int]] = {}
    for e in failures:
        for combo in itertools.combinations(sorted(e.setting.items(), key=lambda v: v[0]), size):
            held.setdefault(combo, set()).add(e.number)
    cleared: set[tuple[Value, ...]] = set()
    for e in successes:
        items = sorted(e.setting.items(), key=lambda v: v[0])
        cleared.update(itertools.combinations(items, size))
    return {combo: numbers for combo, numbers in held.items() if combo not in cleared}


def _tagalongs(singles: Mapping[tuple[Value, ...], set[int]], defaults: Mapping[str, Any]) -> set[tuple[Value, ...]]:
    """The suspects that only came along with another: a conditional parameter's default value
    (`defaults`), every failure holding it held by another suspect that is no such value."""
    candidates = {combo for combo in singles if combo[0][0] in defaults and defaults[combo[0][0]] == combo[0][1]}
    return {
        combo
        for combo in candidates
        if any(other not in candidates and singles[combo] <= numbers for other, numbers in singles.items())
    }


def _causes_of(
    kind: str,
    failures: Sequence[Evidence],
    successes: Sequence[Evidence],
    words: str,
    defaults: Mapping[str, Any],
) -> tuple[list[Cause], list[tuple[tuple[Value, ...], tuple[Value, ...]]], list[Suspect]]:
    """The confirmed causes of one kind, the pairs of suspects that always came together, and
    the suspects too few failures hold yet."""
    held = _suspects(failures, successes, 1)
    # Inductor's default options came with inductor in every failure: judged with it, not as its
    # rival (a tie would exclude only their pair, and a third inductor setting would be measured).
    tagalongs = _tagalongs(held, defaults)
    singles = {combo: numbers for combo, numbers in held.items() if combo not in tagalongs}
    pairs = {
        combo: numbers
        for combo, numbers in _suspects(failures, successes, 2).items()
        if not any((v,) in held for v in combo)
    }
    found: list[Cause] = []
    ties: list[tuple[tuple[Value, ...], tuple[Value, ...]]] = []
    unsettled: list[Suspect] = []
    explained: set[int] = set()
    for suspects in (singles, pairs):
        # Explain before blaming: values before pairs, those held by more failures first, and each
        # counts only the failures no cause found before it explains (issue 38's GRU case: a pair
        # whose every failure was an inductor setting is not blamed once inductor is). Suspects
        # held by as many failures are judged alike, whatever their names.
        level, explained_before = -1, set(explained)
        for combo, numbers in sorted(suspects.items(), key=lambda item: (-len(item[1]), item[0])):
            if len(numbers) != level:
                level, explained_before = len(numbers), set(explained)
            if len(numbers - explained_before) < MIN_FAILURES:
                unsettled.append(Suspect(combo, kind, tuple(sorted(numbers))))
                continue
            rivals = [other for other, theirs in suspects.items() if other != combo and numbers <= theirs]
            if rivals:
                for other in rivals:
                    if suspects[other] == numbers and combo < other:
                        ties.append((combo, other))
                        # Whichever of the two it is, a setting holding both fails: the pair is
                        # excluded now, and the probe settles which one alone.
                        if len(combo) == len(other) == 1:
                            found.append(_cause(kind, combo + other, failures, successes, words))
                            explained |= numbers
                continue
            found.append(_cause(kind, combo, failures, successes, words))
            explained |= numbers
    # A failure a cause explains points at nothing else: its other values are not left open.
    return found, ties, [s for s in unsettled if not set(s.failures) <= explained]


def _cause(
    kind: str, combo: tuple[Value, ...], failures: Sequence[Evidence], successes: Sequence[Evidence], words: str
) -> Cause:
    def holds(e: Evidence) -> bool:
        return all(e.setting.get(name) == value and name in e.setting for name, value in combo)

    with_it = [e for e in (*failures, *successes) if holds(e)]
    without = [e for e in (*failures, *successes) if not holds(e)]
    return Cause(
        combo,
        kind,
        max(e.number for e in (*failures, *successes)),
        sum(1 for e in with_it if e.outcomes[kind]),
        len(with_it),
        sum(1 for e in without if e.outcomes[kind]),
        len(without),
        words,
    )


def _probe(
    kind: str,
    tie: tuple[tuple[Value, ...], tuple[Value, ...]],
    failures: Sequence[Evidence],
    successes: Sequence[Evidence],
    alternatives: Alternatives | None,
) -> Probe | None:
    """The failure holding both suspects that is nearest a success (fewest differing parameters;
    the earliest of equals), with one value of the first suspect changed to that success's, or
    (a parameter the success lacks) to another of its values; None when neither can be had."""
    first, second = tie
    both = [e for e in failures if all(e.setting.get(n) == v for n, v in first + second)]
    if not both or not successes:
        return None

    def nearest_to(e: Evidence) -> Evidence:
        return min(successes, key=lambda s: (_distance(s.setting, e.setting), -s.number))

    # The earliest of equals: seeds come simplest first (one knob changed, then combined).
    failing = min(both, key=lambda e: (_distance(nearest_to(e).setting, e.setting), e.number))
    nearest = nearest_to(failing)
    for name, value in first:
        if (name, value) in second:
            continue
        if name in nearest.setting and nearest.setting[name] != value:
            other = nearest.setting[name]
        else:
            others = [v for v in (alternatives(name, value) if alternatives else ()) if v != value]
            if not others:
                continue
            other = others[0]
        setting = {**failing.setting, name: other}
        return Probe(setting, kind, dropped=((name, value),), kept=second, failing_trial=failing.number)
    return None


def _distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> int:
    return sum(1 for name in set(a) | set(b) if a.get(name) != b.get(name))


__all__ = [
    "MIN_FAILURES",
    "Alternatives",
    "Attribution",
    "Cause",
    "Evidence",
    "NotBlamed",
    "Probe",
    "Suspect",
    "attribute",
]
