"""What each knob contributed, as a tuning run measured it, and how the page tells it from the
search's knob importance.

The verification (tuning/verify/verification.py) runs the best setting interleaved with itself with one knob set
back to its baseline value; the paired ratio is that knob's contribution, a speedup with an interval,
and result.json keeps it (`verification.contributions`). Optuna's importance from trials.csv is
something else: each knob's share of the step time's variance across the search's trials. A knob the
search kept at one value in most trials ranks low however much it gains (autocast at 0.01 in a run
where it alone took the step from 975 ms to 325 ms), so where the run measured contributions the
page shows those instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpu_tuner.core.run_folder import RESULT_JSON
from tpu_tuner.dashboard.folder_files import finite, load_json, reason_of
from tpu_tuner.dashboard.html_cells import esc, note, num_cell, sortable_table
from tpu_tuner.tuning.verify.trim import HARMFUL, HELPS, NOT_SIGNIFICANT

log = logging.getLogger(__name__)

IMPORTANCE_MEANS = (
    "Knob importance (Optuna's PED-ANOVA, from trials.csv): each knob's share of the variance of the step time "
    "across this search's trials (how much the knob decides whether a trial is among the fastest), normalised to "
    "sum to 1; not a speedup: a knob the search kept at one value in most trials ranks low however much it gains."
)


@dataclass(frozen=True)
class Contribution:
    """One knob's measured contribution: how much faster the best is with the knob than with it set
    back to its baseline value, with the interval at `level`."""

    knob: str
    baseline: str
    tuned: str
    speedup: float
    ci_low: float
    ci_high: float
    rounds: int
    level: float
    judged: str = ""  # what the interval says of the knob and what became of it, as report.md puts it

    def describe(self) -> str:
        """ "3.00x [2.90–3.10]": the speedup and its interval."""
        return f"{self.speedup:.2f}x [{self.ci_low:.2f}–{self.ci_high:.2f}]"


@dataclass
class Contributions:
    """A run's measured contributions, the knobs left unmeasured with why, and any problem reading them."""

    measured: list[Contribution] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)
    problem: str = ""


def read_contributions(folder: Path) -> Contributions | None:
    """The contributions in the folder's result.json; None without one. An unreadable one is a
    `problem` (logged), not an unreadable run: the rest of the run is still worth showing."""
    if not (folder / RESULT_JSON).exists():
        return None
    try:
        verification = load_json(folder / RESULT_JSON, "verification")["verification"]
        trim = verification.get("trim") or {}
        # Knobs the recommendation dropped for slowing the best (tuning/verify/trim.py), where it was trimmed.
        dropped = set(trim.get("dropped") or []) if trim.get("recommended") else set()
        measured = [_contribution(entry, dropped) for entry in verification.get("contributions") or []]
        left_out = {str(k): str(v) for k, v in (verification.get("contributions_left_out") or {}).items()}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        text = reason_of(exc)
        problem = text if text.startswith(RESULT_JSON) else f"{RESULT_JSON}: {text}"
        log.warning("no knob contributions from %s: %s", folder, problem)
        return Contributions(problem=problem)
    return Contributions(measured, left_out)


def _contribution(entry: dict[str, Any], dropped: set[str]) -> Contribution:
    speedup = entry["speedup"]
    figures = [speedup["speedup"], speedup["ci_low"], speedup["ci_high"]]
    if not all(finite(x) for x in figures):
        raise ValueError(f"{RESULT_JSON}: contribution of {entry.get('param')!r} is not a number")
    # As report.md judges it (outputs/verification_lines.py): by where the interval lies against 1.
    if figures[1] > 1.0:
        judged = HELPS
    elif figures[2] < 1.0:
        judged = f"{HARMFUL}: dropped" if entry["param"] in dropped else f"{HARMFUL}: kept (the verdict says why)"
    else:
        judged = f"{NOT_SIGNIFICANT}: kept"
    return Contribution(
        knob=str(entry["param"]),
        baseline=str(entry["baseline_value"]),
        tuned=str(entry["best_value"]),
        speedup=float(figures[0]),
        ci_low=float(figures[1]),
        ci_high=float(figures[2]),
        rounds=int(speedup.get("rounds") or 0),
        # One of the window's looks is stated at the whole window's 95% (metrics/paired.py).
        level=0.95 if speedup.get("overall") else float(speedup.get("level") or 0.95),
        judged=judged,
    )


def contributions_html(contributions: Contributions | None) -> str:
    """Under a run's figure: its measured contributions as a table, or what the importance beside
    it means; and which knobs were not measured, with why."""
    out = []
    measured = contributions.measured if contributions else []
    if measured:
        out.append(
            note(
                "What each knob contributed, measured: the verification ran the best setting interleaved with "
                "itself with that one knob set back to its baseline value; the speedup is how much faster the "
                "best is with the knob. Shown instead of the search's knob importance, which is a share of the "
                "step time's variance across the trials, not a speedup.",
                "muted",
            )
        )
        out.append(
            sortable_table(
                ("knob", "baseline", "tuned", "measured contribution [interval]", "interval level", "rounds", "judged"),
                'class="sortable contributions"',
            )
        )
        out += [
            f'<tr data-knob="{esc(c.knob)}"><td>{esc(c.knob)}</td><td>{esc(c.baseline)}</td><td>{esc(c.tuned)}</td>'
            + num_cell(c.speedup, c.describe())
            + num_cell(c.level, f"{c.level * 100:.4g}%")
            + num_cell(c.rounds, str(c.rounds))
            + f"<td>{esc(c.judged)}</td></tr>"
            for c in measured
        ]
        out.append("</tbody></table>")
    else:
        out.append(note(IMPORTANCE_MEANS + " This run has no measured contribution to show instead.", "muted"))
    if contributions and contributions.left_out:
        reasons: dict[str, list[str]] = {}
        for knob, why in contributions.left_out.items():
            reasons.setdefault(why, []).append(knob)
        out += [note(f"Not measured for {', '.join(knobs)}: {why}.", "muted") for why, knobs in reasons.items()]
    if contributions and contributions.problem:
        out.append(note(f"No measured contribution: {contributions.problem}", "bad"))
    return "".join(out)
