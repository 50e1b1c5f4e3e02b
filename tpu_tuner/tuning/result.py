"""The result of a tuning run, rebuilt from the study storage, and the files it writes."""

from __future__ import annotations

import platform
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import torch

from tpu_tuner import knobs
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.runner.measurement import Measurement
from tpu_tuner.search.space import SearchSpace
from tpu_tuner.tuned_config import TunedConfig
from tpu_tuner.tuning import trial_attrs
from tpu_tuner.tuning.options import TuneOptions
from tpu_tuner.tuning.verify import Verification, trial_measurement

TRIAL_COLUMNS = [
    "number", "state", *knobs.names(), "amortised_step_s", "step_median_s",
    "compile_s", "mfu", "accuracy_error", "feasible", "peak_memory_bytes", "failure_kind", "failure_message",
    "rejected_by", "repeat_of", "trial_wall_s", "duration_s",
]

INTEGER_COLUMNS = ("number", "repeat_of", "peak_memory_bytes")


@dataclass
class TuningResult:
    """Best candidate, baseline, verified speedup, and every trial."""

    run_dir: Path
    study: optuna.Study
    space: SearchSpace
    profile: Profile
    findings: dict[str, list[str]]
    verification: Verification
    options: TuneOptions
    worker_starts: int = 0

    @property
    def peak(self) -> tuple[float, str]:
        """The run's one MFU peak (FLOP/s, dtype): the highest any part of the run used.

        A trial worker that beats the profile's peak re-measures it (or raises it to the rate it
        achieved), so trials measured before and after that divided by different figures. Every
        MFU this result reports is recomputed against this one peak: comparable across trials,
        and never above 100%.
        """
        peaks = [(self.profile.peak_flops_per_s, self.profile.peak_dtype)]
        for t in self.study.get_trials(deepcopy=False):
            m = trial_attrs.measurement_of(t)
            if m is not None and m.peak_flops_per_s > 0:
                peaks.append((m.peak_flops_per_s, m.peak_dtype))
        return max(peaks)

    def on_run_peak(self, m: Measurement | None, run_peak: tuple[float, str] | None = None) -> Measurement | None:
        """`m` with its MFU recomputed against the run's one peak (see `peak`)."""
        if m is None:
            return None
        peak, dtype = run_peak or self.peak
        return replace(m, peak_flops_per_s=peak, peak_dtype=dtype, mfu=m.model_flops_per_step / m.step_median / peak)

    @property
    def baseline(self) -> Measurement | None:
        return self.on_run_peak(trial_measurement(self.study, self.verification.baseline_trial))

    @property
    def best(self) -> Measurement | None:
        """The search's best feasible measurement (which may not have been verified)."""
        return self.on_run_peak(trial_measurement(self.study, self.verification.best_trial))

    @property
    def chosen(self) -> Measurement | None:
        return self.best if self.verification.chosen_is_best else self.baseline

    @property
    def best_config(self) -> TunedConfig:
        """The recommended config (the baseline when the win was not significant)."""
        return TunedConfig(self.verification.chosen, self.profile.device.kind, self._provenance(),
                           bucketing=self.chosen_bucketing())

    def chosen_bucketing(self) -> dict[str, Any] | None:
        """The buckets of the chosen setting's trial, when the inputs vary (bucketing/knob.py)."""
        chosen = self.verification.chosen.to_dict()
        for t in self.study.get_trials(deepcopy=False):
            if t.user_attrs.get("buckets") and t.user_attrs.get("candidate") == chosen:
                from tpu_tuner.bucketing.torchtpu import torchtpu_instructions

                return {"buckets": t.user_attrs["buckets"], "align": self.options.bucket_align,
                        "padding_waste": t.user_attrs.get("padding_waste"),
                        "torchtpu": torchtpu_instructions(t.user_attrs["buckets"])}
        return None

    def trials_dataframe(self) -> pd.DataFrame:
        """One row per trial: settings, objective, measurements, failures."""
        rows = []
        run_peak = self.peak
        trials = self.study.get_trials(deepcopy=False)
        measurements = {t.number: trial_attrs.measurement_of(t) for t in trials}
        for t in trials:
            row: dict[str, Any] = {"number": t.number, "state": t.state.name}
            row.update(t.params)
            row.update({k: v for k, v in t.user_attrs.items() if k not in ("measurement", "candidate", "measured")})
            row["duration_s"] = t.duration.total_seconds() if t.duration else None
            # A repeat carries its first trial's figures: its MFU too, on the run's peak.
            measured = self.on_run_peak(measurements.get(t.user_attrs.get("repeat_of", t.number)), run_peak)
            if measured is not None:
                row.update(mfu=measured.mfu, peak_dtype=measured.peak_dtype)
            rows.append(row)
        frame = pd.DataFrame(rows)
        # A stable schema: every documented column is present, even when no trial set it.
        frame = frame.reindex(columns=TRIAL_COLUMNS + [c for c in frame.columns if c not in TRIAL_COLUMNS])
        # Ids and byte counts are integers; pandas' nullable Int64 keeps them so where some rows
        # have none (NaN would turn the whole column into floats: "3.0" in trials.csv).
        for column in INTEGER_COLUMNS:
            frame[column] = pd.to_numeric(frame[column]).round().astype("Int64")
        return frame.drop(columns=[p for p in knobs.names()
                                   if p not in {q.name for q in self.space.searched}])

    def _provenance(self) -> dict[str, Any]:
        v = self.verification
        return {
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "device": self.profile.device.name,
            "device_count": self.profile.device.count,
            "versions": {"tpu_tuner": _version(), "torch": torch.__version__, "optuna": optuna.__version__,
                         "python": platform.python_version()},
            "workload": dict(self.profile.workload),
            "objective": f"amortised step time over {self.options.planned_steps} planned steps",
            "tolerance": self.options.tolerance,
            "accuracy_error": self.chosen.accuracy_error if self.chosen else None,
            "baseline": _summary(self.baseline, self.options.planned_steps),
            "tuned": _summary(self.chosen, self.options.planned_steps),
            "verification": {
                "message": v.message,
                "speedup": v.speedup.speedup if v.speedup else None,
                "ci_low": v.speedup.ci_low if v.speedup else None,
                "ci_high": v.speedup.ci_high if v.speedup else None,
                "rounds": v.speedup.rounds if v.speedup else None,
                "significant": v.chosen_is_best,
            },
            "study": {"storage": _redact(self.study._storage), "name": self.study.study_name,  # noqa: SLF001
                      "trials": len(self.study.trials)},
        }


def _summary(m: Measurement | None, planned_steps: int) -> dict[str, Any] | None:
    if m is None:
        return None
    return {
        "step_median_s": m.step_median, "step_p10_s": m.step_p10, "step_p90_s": m.step_p90,
        "compile_s": m.compile_seconds, "amortised_step_s": m.amortised_step(planned_steps),
        "mfu": m.mfu, "peak_dtype": m.peak_dtype, "peak_memory_bytes": m.peak_memory_bytes,
        "accuracy_error": m.accuracy_error,
    }


def _redact(storage: Any) -> str:
    url = getattr(storage, "url", None) or getattr(getattr(storage, "_backend", None), "url", None)
    if url is None:
        return type(storage).__name__
    from tpu_tuner.credentials import redact

    # Never write a password: the one redaction every writer uses (credentials.py).
    return redact(url if isinstance(url, str) else url.render_as_string(hide_password=False))


def _version() -> str:
    from tpu_tuner import __version__

    return __version__


def write_outputs(result: TuningResult) -> None:
    """tuned_config.toml, trials.csv, report.md and the plots, in the run folder."""
    from tpu_tuner.report.tuning_plots import write_plots
    from tpu_tuner.report.tuning_report import render_report

    run_dir = result.run_dir
    result.best_config.save(run_dir / "tuned_config.toml")
    result.trials_dataframe().to_csv(run_dir / "trials.csv", index=False)
    (run_dir / "profile.json").write_text(result.profile.to_json())
    plots = write_plots(result)
    (run_dir / "report.md").write_text(render_report(result, plots))


__all__ = ["TuningResult", "write_outputs"]
