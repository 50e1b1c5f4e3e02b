"""Where a tuning run's trials came from, for report.md: the warm-start seeds (an earlier study's
best, what it measured there and here) and the hosts that measured them (a shared study)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from optuna.trial import TrialState

from tpu_tuner.core.units import ms

if TYPE_CHECKING:
    from tpu_tuner.tuning.run.tuning_result import TuningResult
    from tpu_tuner.tuning.search.tuning_trial import TuningTrial


def warm_start_section(result: TuningResult) -> list[str]:
    """Where each warm-start trial's setting came from (an earlier study's best: tuning/search/warm_start.py),
    what it measured there and what it measured here; nothing when no trial was warm-started."""
    trials = [t for t in result.trials() if t.warm_start is not None]
    if not trials:
        return []
    base = _trial_value(result, result.verification.baseline_trial)
    out = [
        "## Warm start",
        "",
        "Queued right after the baseline: the best settings of earlier studies on this device kind, the same "
        'workload first, then the nearest by FLOPs per parameter, bound and model kind. "There" is the earlier '
        "study's own measurement (its speedup verified interleaved where it says so, else its search's ratio to "
        'its baseline); "here" is this study\'s.',
        "",
        "| trial | setting | from | there | here |",
        "|---:|---|---|---:|---:|",
    ]
    for t in trials:
        seed = t.warm_start or {}
        earlier = f"trial {seed['trial']} of " if seed.get("trial") is not None else ""
        there = ms_or_blank(seed.get("objective_s"))
        if present(seed.get("speedup")):
            there += (
                f", {float(seed['speedup']):.2f}x {'verified' if seed.get('speedup_verified') else 'in its search'}"
            )
        origin = f"{earlier}{seed.get('source', '?')} ({seed.get('match', '')})"
        out.append(
            f"| {t.number} | {_setting(result, t.params)} | {origin.replace('|', '/')} | {there} | "
            f"{_measured_here(t, base)} |"
        )
    return out + [""]


def hosts_section(result: TuningResult) -> list[str]:
    """Which host measured what, when trials came from more than one (a shared study), and where
    the comparison was re-measured; one line when everything ran on one known host."""
    v = result.verification
    trials = [t for t in result.trials() if t.claims.host]
    hosts = sorted({str(t.claims.host) for t in trials})
    verified_on = getattr(v, "host", None)
    if len(hosts) <= 1:
        if not verified_on:
            return []
        where = f"Every trial ran on host `{hosts[0]}`" if hosts else "The trials record no host"
        if hosts == [verified_on]:
            return ["## Hosts", "", f"{where}, and so did the comparison above.", ""]
        return ["## Hosts", "", f"{where}; the comparison above was re-measured on host `{verified_on}`.", ""]
    out = [
        "## Hosts",
        "",
        "Trials from different hosts only rank settings (each host's timings are its own); the comparison "
        f"above was re-measured on {'host `' + verified_on + '`' if verified_on else 'one host'}.",
        "",
        "| host | trials measured | best objective there |",
        "|---|---:|---:|",
    ]
    for host in hosts:
        own = [t for t in trials if t.claims.host == host and not t.is_repeat]
        measured = sum(1 for t in own if t.measured)
        values = [t.value for t in own if t.value is not None and t.feasible]
        out.append(f"| {host} | {measured} | {ms_or_blank(min(values)) if values else 'none feasible'} |")
    return out + [""]


def _setting(result: TuningResult, params: dict) -> str:
    """A trial's setting as the report names settings ("inductor, matmul highest, autocast bfloat16")."""
    try:
        return result.space.to_candidate(params).describe()
    except Exception:
        return ", ".join(f"{k}={v}" for k, v in params.items())


def _trial_value(result: TuningResult, number: int | None) -> float | None:
    if number is None:
        return None
    trial = next((t for t in result.study.get_trials(deepcopy=False) if t.number == number), None)
    return trial.value if trial is not None else None


def _measured_here(trial: TuningTrial, baseline_value: float | None) -> str:
    """A trial's objective here (and its ratio to the baseline's), or why it has none."""
    kind = trial.failure.kind if trial.failure is not None else None
    if trial.state == TrialState.COMPLETE and trial.value is not None:
        text = ms_or_blank(trial.value)
        if baseline_value:
            text += f", {baseline_value / trial.value:.2f}x the baseline"
        if not trial.feasible:  # a complete trial's record always says (trial_attrs.record_measurement)
            text += f", infeasible ({kind or 'constraint'})"
        return text
    if trial.state in (TrialState.WAITING, TrialState.RUNNING):
        return "not measured yet"
    if trial.rejected_by:
        return f"rejected ({trial.rejected_by.replace('|', '/')})"
    if trial.excluded_by:
        return f"excluded ({trial.excluded_by}), not measured"
    if trial.stopped_early:
        return "stopped early (hopeless against the best so far)"
    # A failed measurement is told as pruned with a violated constraint (tuning/search/trials.py).
    failed = trial.state == TrialState.FAIL or kind is not None
    state = "failed" if failed else trial.state.name.lower()
    return state + (f" ({str(kind).replace('|', '/')})" if kind else "")


def present(value) -> bool:
    """False for None, NaN and pandas' NA (trials.csv's nullable integer columns)."""
    return value is not None and not bool(pd.isna(value))


def ms_or_blank(value) -> str:
    """Seconds as the report writes them ("" when absent)."""
    return ms(float(value)) if present(value) else ""
