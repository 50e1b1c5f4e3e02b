"""Read a finished tuning run back for benchmarks/tuning/failure_learning.py: which trials were measured,
which of them carried a known-bad knob value, how they failed, and the verified speedup.

The figures come from the run folder's files (trials.csv, result.json), read with the standard
library, not through tpu_tuner: the benchmark must read runs made by the version before failure
learning and by the one after, and the package on PYTHONPATH may be either (or neither). Only
the "queued" count opens the study, with Optuna, and is left out ("?") where that fails.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

# User attributes (trials.csv columns) that say a trial measured nothing: a repeat answered from
# an earlier trial, a setting an agent turned away, one another worker was measuring, one asked
# past the budget, or (the version with failure learning) a setting excluded by what earlier
# failures taught. Columns appear only where some trial set them, hence the lookups by name.
NOT_MEASURED = ("repeat_of", "rejected_by", "excluded_by", "in_flight_elsewhere", "over_budget")
BOOLEAN_MARKS = ("in_flight_elsewhere", "over_budget")  # the others hold a trial number or a reason
# Columns that hold what a measurement gave: its wall time in the parent (set with the
# "measured" attribute, never copied to a repeat), a figure, or how it failed.
MEASURED_EVIDENCE = ("trial_wall_s", "amortised_step_s", "failure_kind")


@dataclass(frozen=True)
class BadValue:
    """A knob value a fault model fails under, as trials.csv spells it: `param` is the column,
    `value` one of its choices or, for composite choices (compile options "a+b"), one part."""

    param: str
    value: str
    kind: str  # the failure kind the fault gives: crash, oom, accuracy, error

    def matches(self, row: dict[str, str]) -> bool:
        cell = (row.get(self.param) or "").strip()
        return cell == self.value or self.value in cell.split("+")

    def __str__(self) -> str:
        return f"{self.param}={self.value}"


@dataclass(frozen=True)
class RunFigures:
    """What one run spent on its bad value, and what it ended with."""

    measured: int  # settings measured in all
    failed: int  # of those, how many failed (any kind)
    bad_measured: int  # measured settings that carried the bad value
    bad_failed: int  # of those, how many failed (any kind)
    bad_failed_as_expected: int  # of those, how many failed with the fault's own kind
    bad_queued: int | None  # of the measured ones, how many were queued (seeds, agents' follow-ups), not sampled
    bad_unmeasured: int  # trials with the bad value answered without measuring (repeat, rejection, exclusion)
    speedup: float | None  # the verified speedup; None when the run verified none
    verification: str  # result.json's verification message
    chosen_has_bad: bool  # whether the recommended settings carry the bad value (they never should)


def trials_csv(run_dir: Path) -> Path:
    """The run's trials table (run_dir/trials.csv; run_dir/study/trials.csv if a version moves it)."""
    for candidate in (run_dir / "trials.csv", run_dir / "study" / "trials.csv"):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"{run_dir}: no trials.csv")


def read_trials(run_dir: Path) -> list[dict[str, str]]:
    """trials.csv as rows of strings (no type guessing: "4" stays "4", an empty cell is "")."""
    with trials_csv(run_dir).open(newline="") as f:
        return list(csv.DictReader(f))


def _present(cell: str | None) -> bool:
    """A user attribute set on the trial (a trial number such as "0" counts: repeat_of = 0)."""
    return bool(cell and cell.strip())


def _true(cell: str | None) -> bool:
    """A boolean user attribute set and true."""
    return _present(cell) and cell.strip().lower() not in ("false", "0")


def is_measured(row: dict[str, str]) -> bool:
    """Whether the trial ran the model. Read from attributes, not the state: the version with
    failure learning may tell a failure as PRUNED (for the sampler) instead of FAIL."""
    if any(_true(row.get(mark)) if mark in BOOLEAN_MARKS else _present(row.get(mark)) for mark in NOT_MEASURED):
        return False
    # Whatever the version after names its exclusion record, "excluded..." says unmeasured.
    if any(column.startswith("excluded") and _true(cell) for column, cell in row.items() if column):
        return False
    if _present(row.get("measured")):  # a version that writes the "measured" attribute to trials.csv
        return _true(row["measured"])
    return any(_present(row.get(column)) for column in MEASURED_EVIDENCE)


def verification_of(run_dir: Path) -> tuple[float | None, str]:
    """(verified speedup, message) from result.json; the speedup is None unless it was verified."""
    result = json.loads((run_dir / "result.json").read_text())
    verification = result.get("verification") or {}
    message = str(verification.get("message", "no verification recorded"))
    speedup = (verification.get("speedup") or {}).get("speedup")
    verified = message.startswith("verified") and verification.get("chosen_is_best", False)
    return (float(speedup) if verified and speedup is not None else None), message


def queued_numbers(run_dir: Path) -> set[int] | None:
    """Numbers of the trials that were queued (`enqueue_trial`: the baseline, the agents' seeds,
    their follow-ups) rather than proposed by the sampler; None where the study cannot be read.
    Optuna marks them with the "fixed_params" system attribute, which trials.csv leaves out."""
    try:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        saved = json.loads((run_dir / "run.json").read_text())
        study = optuna.load_study(study_name=saved["study_name"], storage=saved["storage"])
    except Exception:
        return None
    return {t.number for t in study.get_trials(deepcopy=False) if "fixed_params" in t.system_attrs}


def chosen_settings(run_dir: Path) -> dict[str, str]:
    """The recommended settings (result.json's verification.chosen), values as strings."""
    chosen = json.loads((run_dir / "result.json").read_text()).get("verification", {}).get("chosen") or {}
    return {str(k): str(v) for k, v in chosen.items()}


def figures_of(run_dir: Path, bad: BadValue) -> RunFigures:
    """The run's figures against its model's bad value."""
    rows = [row for row in read_trials(run_dir) if row.get("state") not in ("WAITING", "RUNNING")]
    measured = [row for row in rows if is_measured(row)]
    bad_rows = [row for row in measured if bad.matches(row)]
    failed = [row for row in measured if _failed(row)]
    bad_failed = [row for row in bad_rows if _failed(row)]
    speedup, message = verification_of(run_dir)
    queued = queued_numbers(run_dir)
    return RunFigures(
        measured=len(measured),
        failed=len(failed),
        bad_measured=len(bad_rows),
        bad_failed=len(bad_failed),
        bad_failed_as_expected=sum(1 for row in bad_failed if row.get("failure_kind") == bad.kind),
        bad_queued=None if queued is None else sum(1 for row in bad_rows if int(row["number"]) in queued),
        bad_unmeasured=sum(1 for row in rows if bad.matches(row) and not is_measured(row)),
        speedup=speedup,
        verification=message,
        chosen_has_bad=bad.matches(chosen_settings(run_dir)),
    )


def _failed(row: dict[str, str]) -> bool:
    return _present(row.get("failure_kind"))
