"""report.md's lines on the verification window: each knob's contribution and what it decided,
the rounds left out as disturbed, and the settings whose rounds were unsteady."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpu_tuner.core.units import ms
from tpu_tuner.metrics.disturbed import DISTURBED_DEVIATIONS

if TYPE_CHECKING:
    from tpu_tuner.tuning.verify.trim import KnobContribution
    from tpu_tuner.tuning.verify.verification import Verification


def disturbed_lines(v: Verification) -> list[str]:
    """The window's rounds left out as disturbed, each with its steps, or nothing."""
    if not v.disturbed_rounds:
        return []
    rounds = "; ".join(
        f"round {d.round} ({', '.join(f'{label} {ms(step)}' for label, step in d.steps.items())})"
        for d in v.disturbed_rounds
    )
    return [
        "- Disturbed rounds, left out and re-run where the clock allowed (a step more than "
        f"{DISTURBED_DEVIATIONS:g} robust deviations above its setting's median in the window, or a ratio as far "
        f"off the median ratio: docs/tuning.md): {rounds}."
    ]


def unsteady_lines(v: Verification) -> list[str]:
    """The settings whose rounds the window found bimodal or drifting, and what was done, or nothing."""
    if not v.unsteady:
        return []
    added = v.unsteady_added
    done = (
        ""
        if added is None
        else " The clock left no room to add rounds for them."
        if added == 0
        else f" {added} round{'s were' if added > 1 else ' was'} added for them, once."
    )
    return [
        "- Unsteady rounds (two clusters of a setting's rounds, or a trend over them, judged per setting and for "
        f"the ratio: docs/tuning.md): {'; '.join(u.describe() for u in v.unsteady)}.{done}"
    ]


def contributions_section(v: Verification) -> list[str]:
    """Each knob's measured contribution, and why any is missing, from what the verification recorded."""
    out = []
    if v.contributions:
        out += [
            "Measured, interleaved with the best configuration in the same window: the speedup the best has "
            "over itself with that one knob set back to its baseline value. An interval wholly below 1 means the "
            "best is faster without the knob: it is dropped from the recommendation, which is re-verified without "
            "it where the clock allows (docs/tuning.md). One that holds 1 is *not significant*: these rounds cannot "
            "tell its effect from none, and the knob is kept as the search chose it.",
            "",
            "| knob | baseline | tuned | contribution | judged |",
            "|---|---|---|---|---|",
        ]
        out += [
            f"| {c.param} | {c.baseline_value} | {c.best_value} | {c.speedup.describe()} | {_judged(c, v)} |"
            for c in v.contributions
        ]
        if len(v.contributions) == 1 and not v.contributions_left_out:
            out += ["", "Only this knob changed: its contribution is the verified speedup itself."]
        out += _trim_lines(v)
    elif v.speedup is None and v.best_trial is not None and v.best_trial == v.baseline_trial:
        return ["Nothing to attribute: the search's best setting is the baseline."]
    elif v.speedup is None:
        return [f"Not measured: the interleaved verification did not run to its end ({v.message})."]
    elif not v.contributions_left_out:
        return ["Not recorded: this run's result.json predates the record of why no contribution was measured."]
    reasons: dict[str, list[str]] = {}
    for knob, why in v.contributions_left_out.items():
        reasons.setdefault(why, []).append(knob)
    return (
        out + ([""] if out else []) + [f"Not measured for {', '.join(knobs)}: {why}." for why, knobs in reasons.items()]
    )


def _judged(c: KnobContribution, v: Verification) -> str:
    """What the contribution's interval says of the knob (`KnobContribution.judged`), and what
    became of it."""
    if c.speedup.significant:
        return c.judged
    if not c.harmful:
        return f"{c.judged}: kept"
    dropped = v.recommends_trimmed and v.trim is not None and c.param in v.trim.dropped
    return f"{c.judged}: dropped" if dropped else f"{c.judged}: kept (the verdict says why)"


def _trim_lines(v: Verification) -> list[str]:
    """The trimmed setting's own re-verification, where it ran."""
    trim = v.trim
    if trim is None or trim.speedup is None:
        return []
    outcome = "recommended" if trim.recommended else "not recommended"
    return [
        "",
        f"The best without {', '.join(trim.dropped)}, re-verified against the baseline in a window of its own: "
        f"{trim.speedup.describe()}, {trim.verdict}: {outcome}.",
    ]


__all__ = ["contributions_section", "disturbed_lines", "unsteady_lines"]
