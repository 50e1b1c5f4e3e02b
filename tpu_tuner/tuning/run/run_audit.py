"""A finished tuning run's report read back against its own files: every sentence checkable from
them checked (issue 55's "0 false sentences").

The report (report.md) is written from the study; trials.csv, result.json, run.json and
tuned_config.toml are written from the same. What a user reads in one must not contradict
another: the trials the report numbers are trials.csv's, in the same outcome words; its count is
theirs; no row of a trial that never ran; the recommendation holds no knob its own measured
contribution says slows it; a knob whose interval holds 1 is called not significant; the header's
batch and sequence are what the workload declares; no bf16 setting reads an error of exactly 0
(the float32 underflow of issue 55); no library's raw message; one peak-memory figure; the run
ended within 5% of its clock; "no gain" only where a candidate was compared.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

from tpu_tuner.studies.outcome import TRIED, Outcome, tally
from tpu_tuner.tuning.run.tuning_result import TuningResult

CLOCK_SLACK = 0.05  # a run may end this share past its --time-budget (issue 55's target)
# Words of a library's own error that a report line must not carry (they belong in workers.log).
RAW_MESSAGES = ("Traceback (most recent call last)", "file a github issue", "Please file", "site-packages/")
TABLE_ROW = re.compile(r"^\| (\d+) \| ([^|]+) \|")


def audit(run_dir: Path, wall_s: float | None = None) -> list[str]:
    """Every contradiction found between the run folder's report and its other files, in words
    (empty: none found); `wall_s`: the run's wall time as measured around its process."""
    run_dir = Path(run_dir)
    missing = [name for name in ("report.md", "trials.csv", "result.json") if not (run_dir / name).exists()]
    if missing:
        return [f"{run_dir.name}: no {', '.join(missing)}"]
    report = (run_dir / "report.md").read_text()
    trials = pd.read_csv(run_dir / "trials.csv")
    result = json.loads((run_dir / "result.json").read_text())
    findings = _numbering(report, trials) + _outcomes(report, trials) + _contributions(report, result, run_dir)
    findings += _errors(trials) + _raw_messages(report) + _memory_figures(report)
    findings += _clock(result, run_dir, wall_s) + _no_gain(result, trials) + _header(report, run_dir, result)
    return findings


def _trials_table(report: str) -> list[str]:
    """The lines of report.md's "## Trials" section (other tables' rows may start with a number too)."""
    section = report.split("\n## Trials\n", 1)[-1] if "\n## Trials\n" in report else report
    return section.split("\n## ", 1)[0].splitlines()


def _numbering(report: str, trials: pd.DataFrame) -> list[str]:
    """The report's trial rows and every "trial N" it names are trials.csv's trials."""
    numbers = {int(n) for n in trials["number"]}
    rows = {int(m.group(1)) for line in _trials_table(report) if (m := TABLE_ROW.match(line))}
    found = []
    if rows != numbers:
        found.append(f"report.md's trials table numbers {sorted(rows ^ numbers)} differently from trials.csv")
    named = {int(n) for n in re.findall(r"\btrials? (\d+)\b", report)}
    unknown = sorted(named - numbers)
    if unknown:
        found.append(f"report.md names trial(s) {unknown} that trials.csv does not hold")
    return found


def _outcomes(report: str, trials: pd.DataFrame) -> list[str]:
    """Each row's outcome word is trials.csv's, the count is theirs, and no row is of a trial that
    never ran or holds a missing value."""
    found = []
    words = dict(zip((int(n) for n in trials["number"]), trials.get("outcome", trials["state"])))
    for line in _trials_table(report):
        m = TABLE_ROW.match(line)
        if m and str(words.get(int(m.group(1)))) != m.group(2).strip():
            number, word = int(m.group(1)), m.group(2).strip()
            found.append(f"trial {number} reads {word!r} in report.md, {words.get(number)!r} in trials.csv")
        if m and (" nan " in line or "WAITING" in line):
            found.append(f"trial {m.group(1)}'s row in report.md holds nan or WAITING")
    if "outcome" in trials:
        count = tally([Outcome(o) for o in trials["outcome"]])
        if count not in report:
            found.append(f"report.md does not count its trials as trials.csv does ({count!r})")
    return found


def _contributions(report: str, result: dict[str, Any], run_dir: Path) -> list[str]:
    """The recommendation keeps no knob whose whole interval is below 1; one whose interval holds
    1 is called not significant."""
    verification = result.get("verification") or {}
    chosen = verification.get("chosen") or {}
    trim = verification.get("trim") or {}
    # A trim the verdict declined (not re-verified in time, or found inaccurate) keeps the best, and says why.
    declined = bool(trim) and not trim.get("recommended")
    found = []
    for c in verification.get("contributions") or []:
        speedup, knob = c.get("speedup") or {}, c.get("param")
        low, high = speedup.get("ci_low"), speedup.get("ci_high")
        kept = chosen.get(knob) == c.get("best_value") != c.get("baseline_value")
        if high is not None and high < 1.0 and kept and not declined:
            found.append(
                f"the recommendation keeps {knob}={c.get('best_value')}, whose contribution's interval lies below 1"
            )
        row = next((line for line in report.splitlines() if line.startswith(f"| {knob} |")), None)
        if low is not None and high is not None and low <= 1.0 <= high and row is not None:
            if "not significant" not in row:
                found.append(f"{knob}'s contribution holds 1 and report.md does not call it not significant")
    return found


def _errors(trials: pd.DataFrame) -> list[str]:
    """No setting that ran its matmuls or activations in bf16 reads an error of exactly 0."""
    if "accuracy_error" not in trials or "autocast" not in trials:
        return []
    exact = trials[(pd.to_numeric(trials["accuracy_error"], errors="coerce") == 0) & (trials["autocast"] == "bfloat16")]
    return [f"trial {int(n)} runs bf16 autocast and reads an accuracy error of exactly 0" for n in exact["number"]]


def _raw_messages(report: str) -> list[str]:
    return [f"report.md carries a library's raw message ({words!r})" for words in RAW_MESSAGES if words in report]


def _memory_figures(report: str) -> list[str]:
    """The baseline's peak memory is one figure wherever report.md gives it."""
    said = re.search(r"baseline peak memory ([\d.]+ [KMG]iB)", report)
    row = re.search(r"^\| peak memory \| ([^|]+) \|", report, re.M)
    if said and row and said.group(1) != row.group(1).strip():
        return [f"report.md gives the baseline's peak memory as {said.group(1)} and as {row.group(1).strip()}"]
    return []


def _clock(result: dict[str, Any], run_dir: Path, wall_s: float | None) -> list[str]:
    """The run ended within `CLOCK_SLACK` of its --time-budget."""
    budget = (result.get("options") or {}).get("time_budget_s")  # the options, flat (TuneOptions.to_plain)
    if not budget:
        return []
    spent = wall_s
    if spent is None and (run_dir / "run.json").exists():
        run = json.loads((run_dir / "run.json").read_text())
        if run.get("started") and run.get("updated"):
            spent = (pd.Timestamp(run["updated"]) - pd.Timestamp(run["started"])).total_seconds()
    if spent is not None and spent > budget * (1 + CLOCK_SLACK):
        return [f"the run took {spent:.0f} s, {spent / budget - 1:.0%} past its {budget:.0f} s clock"]
    return []


def _no_gain(result: dict[str, Any], trials: pd.DataFrame) -> list[str]:
    """ "no gain" is said only where a setting other than the baseline was measured."""
    message = str((result.get("verification") or {}).get("message", ""))
    if not message.startswith("no gain") or "outcome" not in trials:
        return []
    tried = trials[trials["outcome"].isin(list(TRIED))]
    return [] if len(tried) > 1 else ["the verdict says no gain, and no setting but the baseline was tried"]


def _header(report: str, run_dir: Path, result: dict[str, Any]) -> list[str]:
    """The header's batch and sequence are the run's own words for them (the workload's dims),
    and a size it says came from a flag was given by one."""
    options = result.get("options") or {}
    header = report.splitlines()[2] if len(report.splitlines()) > 2 else ""
    flags = [f for f, key in (("--batch-size", "batch_size"), ("--seq-len", "seq_len")) if f"({f})" in header]
    found = [
        f"report.md's header says a size came from {f}, which the run was not given"
        for f in flags
        if options.get("batch_size" if f == "--batch-size" else "seq_len") is None
    ]
    try:
        sizes = TuningResult.load(run_dir).workload_sizes
    except Exception as exc:  # an unreadable folder is a finding of its own
        return [*found, f"{run_dir.name} does not load back ({type(exc).__name__})"]
    if sizes and sizes not in header:
        found.append(f"report.md's header does not say the workload's sizes ({sizes!r})")
    return found


__all__ = ["CLOCK_SLACK", "audit"]
