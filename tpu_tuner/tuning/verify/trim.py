"""The recommendation trimmed of harmful knobs: the verified best less every knob that slows it.

Each knob's contribution is the speedup the best has over itself with that one knob set back to
the baseline's value, measured in the best's own window (tuning/verify/verification.py). An interval wholly
below 1 says the best is faster without the knob (issue 55: a ResNet's best kept matmul medium at
0.95x [0.92-0.97] and int8 weight-only at 0.97x [0.94-0.99]); an interval holding 1 says nothing
either way, so such a knob is *not significant* and kept as the search chose it (dropping it would
be a guess). Every harmful knob is set back at once, and the trimmed setting:

* when the clock has room for a verification of its own (`plan_finish` without race or
  contributions), is re-verified against the baseline in a new window, and that verdict decides:
  verified, the trimmed setting is recommended; not, the best stays where it was verified (else
  the baseline);
* without room, a verified best is recommended trimmed on the measured contributions, and the
  verdict says its speedup was not re-measured.

A trimmed setting the search measured and found inaccurate is never recommended; one it never
measured has had no accuracy check of its own (it sets back knobs of a setting that passed to the
baseline's values), and the verdict says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tpu_tuner.metrics.paired import PairedSpeedup, VerdictKind

if TYPE_CHECKING:
    from tpu_tuner.tuning.search.tuning_trial import TuningTrial
    from tpu_tuner.tuning.verify.verify_window import DecidedWindow

TRIMMED = "trimmed"  # the trimmed setting's label in its window's samples
NOT_SIGNIFICANT = "not significant"
HARMFUL = "slows the best"
HELPS = "speeds the best"
KEEP_BASELINE = "; keep the baseline"  # how a verdict that recommends nothing ends (tuning/verify/verification.py)


@dataclass
class KnobContribution:
    """How much slower the best gets when one knob goes back to its baseline value."""

    param: str
    baseline_value: str
    best_value: str
    speedup: PairedSpeedup

    @property
    def harmful(self) -> bool:
        """The whole interval below 1: the best is faster without this knob."""
        return self.speedup.ci_high < 1.0

    @property
    def judged(self) -> str:
        """`HELPS` (interval above 1), `HARMFUL` (below) or `NOT_SIGNIFICANT` (it holds 1)."""
        return HELPS if self.speedup.significant else HARMFUL if self.harmful else NOT_SIGNIFICANT

    def describe(self) -> str:
        s = self.speedup
        return f"{self.param} {s.speedup:.2f}x, CI {s.ci_low:.2f}-{s.ci_high:.2f}"


@dataclass
class Trim:
    """The knobs dropped from the best for their contributions, and what came of it."""

    dropped: list[str]
    recommended: bool  # whether the trimmed setting is the recommendation
    trial: int | None = None  # the search's trial of the trimmed setting (None: it never measured it)
    # Its re-verification against the baseline (None: not re-measured), on the kept rounds of its
    # window (`samples`: "baseline" and `TRIMMED`), and that window's `VerdictKind` value.
    speedup: PairedSpeedup | None = None
    samples: dict[str, list[float]] = field(default_factory=dict)
    verdict: str = ""


@dataclass(frozen=True)
class Trimmed:
    """What `trim` decided: the trim, the recommended parameters and the verdict with its words."""

    trim: Trim
    params: dict[str, Any]
    verdict: VerdictKind
    message: str


def trim(
    contributions: Sequence[KnobContribution],
    best_params: dict[str, Any],
    baseline_params: dict[str, Any],
    normalize: Callable[[dict[str, Any]], dict[str, Any]],
    trials: Sequence[TuningTrial],
    first: tuple[VerdictKind, str],
    reverify: Callable[[dict[str, Any]], DecidedWindow | str] | None,
    no_room: str,
) -> Trimmed | None:
    """The module's rule on the best's `contributions` (None: no knob is harmful). `first`: the
    best's verdict and its words; `reverify(params)` runs the trimmed setting's window against the
    baseline (None where the clock has no room for one, `no_room` saying why)."""
    harmful = [c for c in contributions if c.harmful]
    if not harmful:
        return None
    verdict, said = first
    best_verified = verdict is VerdictKind.VERIFIED
    kept = best_params if best_verified else baseline_params
    lead = said.removesuffix(KEEP_BASELINE)  # said again at the end, after what the trim found
    tail = "" if best_verified else KEEP_BASELINE
    names = [c.param for c in harmful]
    found = f"{_and(names)} slowed the best ({'; '.join(c.describe() for c in harmful)}: {_their(names)} below 1)"
    params = normalize({**best_params, **{c.param: c.baseline_value for c in harmful}})
    trial = next((t for t in trials if t.params == params and t.measurement is not None), None)
    number = trial.number if trial is not None else None

    def keeping(why: str, measured: Trim | None = None) -> Trimmed:
        return Trimmed(measured or Trim(names, False, number), kept, verdict, f"{lead}; {found}, {why}{tail}")

    if params == baseline_params:
        return keeping("and without them the setting is the baseline's")
    if trial is not None and not trial.is_feasible:
        return keeping(f"but the best without them failed the accuracy guardrail in the search (trial {number})")
    unchecked = (
        ""
        if trial is not None
        else "; its accuracy was not measured on its own (the search never ran it: it sets knobs of a setting that "
        "passed back to the baseline's values)"
    )
    decided = reverify(params) if reverify is not None else no_room
    if isinstance(decided, str):
        if not best_verified:
            return keeping(f"but the best without them was not re-measured ({decided})")
        return Trimmed(
            Trim(names, True, number),
            params,
            verdict,
            f"{lead}; {found}: dropped on their measured contributions, the recommendation is the best without "
            f"them, whose speedup was not re-measured ({decided}){unchecked}",
        )
    s = decided.speedup
    verified = decided.verdict is VerdictKind.VERIFIED
    measured = Trim(
        names, verified, number, s, {"baseline": decided.kept(0), TRIMMED: decided.kept(1)}, decided.verdict
    )
    if not verified:
        either = "" if best_verified else " either"
        why = f"but the best without them was not verified against the baseline{either}"
        kept_words = "; the best is kept" if best_verified else ""
        return keeping(f"{why} ({decided.verdict}, {s.describe()}){kept_words}", measured)
    return Trimmed(
        measured,
        params,
        VerdictKind.VERIFIED,
        f"verified: {s.describe()}, the best without {_and(names)}, re-verified against the baseline in a window of "
        f"its own; {found}; the best with them: {lead}{unchecked}",
    )


def _and(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _their(names: Sequence[str]) -> str:
    return "its interval lay wholly" if len(names) == 1 else "each interval lay wholly"


__all__ = ["HARMFUL", "HELPS", "NOT_SIGNIFICANT", "TRIMMED", "KnobContribution", "Trim", "Trimmed", "trim"]
