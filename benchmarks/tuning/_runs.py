"""Shared helpers of the benchmarks: read a finished tuning run back from its folder."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import optuna

from tpu_tuner.knobs.tuned_config import TunedConfig
from tpu_tuner.tuning.search.tuning_trial import TuningTrial


def load_study(run_dir: Path) -> optuna.Study:
    saved = json.loads((run_dir / "run.json").read_text())
    return optuna.load_study(study_name=saved["study_name"], storage=saved["storage"])


def trial_overheads(run_dir: Path) -> list[float]:
    """Per measured trial: wall time seen by the parent minus first call, warm-up and timed steps."""
    overheads = []
    for trial in TuningTrial.all(load_study(run_dir).trials):
        m, wall = trial.measurement, trial.costs.wall_s
        if m is not None and wall is not None:
            overheads.append(wall - m.first_call_seconds - m.warmup_seconds - sum(m.samples))
    return overheads


def describe_run(run_dir: Path) -> str:
    """The verified speedup, accuracy error and per-trial overhead of a finished run."""
    config = TunedConfig.load(run_dir / "tuned_config.toml")
    p = config.provenance
    v = p["verification"]
    base, tuned = p["baseline"], p.get("tuned")
    overheads = trial_overheads(run_dir)
    lines = [f"run: {run_dir}", f"  chosen: {config.candidate.describe()}"]
    if tuned is None:
        # A recommendation the search never measured (a knob that slowed the best was dropped and
        # the rest re-verified): it has the verification's figures alone.
        lines += [
            f"  baseline step {base['step_median_s'] * 1e3:.1f} ms (MFU {base['mfu']:.1%}); the chosen "
            "setting was not measured by the search (a knob dropped after the race)",
            f"  verification: {v['message']}",
        ]
    else:
        lines += [
            f"  baseline step {base['step_median_s'] * 1e3:.1f} ms (MFU {base['mfu']:.1%}); "
            f"tuned step {tuned['step_median_s'] * 1e3:.1f} ms (MFU {tuned['mfu']:.1%}, "
            f"compile {tuned['compile_s']:.1f} s in the search)",
            # Configs written before the source was recorded took their steps from the search.
            f"  steps from: {tuned.get('step_source', 'the search')}",
            f"  verification: {v['message']}",
            f"  accuracy error of the chosen config: {tuned['accuracy_error']:.2e} (tolerance {p['tolerance']:g})",
        ]
    if overheads:
        lines.append(
            f"  per-trial overhead outside warm-up and timed steps: median {statistics.median(overheads):.2f} s, "
            f"max {max(overheads):.2f} s over {len(overheads)} measured trials"
        )
    return "\n".join(lines)
