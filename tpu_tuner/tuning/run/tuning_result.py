"""The result of a tuning run, rebuilt from the study storage; saved and loaded back by run folder.

The files are written by `tpu_tuner.outputs.write.write_tuning`; `TuningResult.load(run_dir)` reads a
finished run back (the study from its storage, profile.json, result.json). Nothing here imports
`tpu_tuner.outputs`: the reports depend on the result, never the other way round.
"""

from __future__ import annotations

import dataclasses
import json
import platform
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import torch

from tpu_tuner.core import run_folder
from tpu_tuner.core.credentials import redact
from tpu_tuner.core.errors import UserInputError, first_line
from tpu_tuner.core.plain_data import from_plain, json_default
from tpu_tuner.core.version import __version__
from tpu_tuner.execution.measurement import Measurement
from tpu_tuner.knobs.tuned_config import TunedConfig
from tpu_tuner.metrics.mfu import common_peak, mfu
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.tuning.options.tune_options import TuneOptions
from tpu_tuner.tuning.run.finished_run import RESULT_FORMAT, load_space, load_study, read_finished_run
from tpu_tuner.tuning.run.shared_study import RECORD_ATTR
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.search.trials_table import trials_frame
from tpu_tuner.tuning.search.tuning_trial import TuningTrial
from tpu_tuner.tuning.verify.trim import TRIMMED
from tpu_tuner.tuning.verify.verification import Verification, trial_measurement
from tpu_tuner.tuning.verify.window_figures import (
    ComparedSteps,
    WindowFigures,
    WindowStep,
    step_disagreement,
    with_window_step,
)
from tpu_tuner.tuning.verify.window_marks import WindowMark, mark_against_window, race_marks


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
    # False for a worker of a shared study that left the verification to another worker (or to
    # `tpu-tune study finish`): its verification holds only why, and it writes no tuned config.
    verified: bool = True
    # When the result was made (the tuned config's provenance): kept by save and load, so a
    # loaded result's best_config is the one the run wrote.
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    # The URL of the storage `study` was opened with (None: a study in memory), to show it
    # redacted: Optuna gives a study's storage no public accessor.
    storage_url: str | None = None

    def trials(self) -> list[TuningTrial]:
        """The study's trials as records (tuning/search/tuning_trial.py), read now: the reports take these."""
        return TuningTrial.all(self.study.get_trials(deepcopy=False))

    @property
    def peak(self) -> tuple[float, str]:
        """The run's one MFU peak (FLOP/s, dtype): the highest any part of the run used.

        A trial worker that beats the profile's peak re-measures it (or raises it to the rate it
        achieved), so trials measured before and after that divided by different figures. Every
        MFU this result reports is recomputed against this one peak: comparable across trials,
        and never above 100%.
        """
        peaks = [(self.profile.peak_flops_per_s, self.profile.peak_dtype)]
        for t in self.trials():
            m = t.measurement
            if m is not None and m.peak_flops_per_s > 0:
                peaks.append((m.peak_flops_per_s, m.peak_dtype))
        return common_peak(peaks)

    def on_run_peak(self, m: Measurement | None, run_peak: tuple[float, str] | None = None) -> Measurement | None:
        """`m` with its MFU recomputed against the run's one peak (see `peak`)."""
        if m is None:
            return None
        peak, dtype = run_peak or self.peak
        return replace(m, peak_flops_per_s=peak, peak_dtype=dtype, mfu=mfu(m.model_flops_per_step, m.step_median, peak))

    @property
    def exclusions(self) -> list[str]:
        """What the search excluded, in words: each failure cause the study holds
        (tuning/search/failure_learning.py)."""
        from tpu_tuner.tuning.search.failure_learning import label, stored_causes

        return [cause.describe(label) for cause in stored_causes(self.study.user_attrs)]

    @property
    def not_blamed(self) -> list[str]:
        """The failure kinds the search blamed on no knob value (the baseline shares them), in words."""
        from tpu_tuner.tuning.search.failure_learning import stored_not_blamed

        return [note.describe() for note in stored_not_blamed(self.study.user_attrs)]

    @property
    def workload_sizes(self) -> str:
        """The batch and sequence as the report's header says them: from what the workload declares
        (model/workloads/input_dims.py), else from its recorded sizes and input shapes, never a guessed batch."""
        fingerprint = (self.study.user_attrs.get(RECORD_ATTR) or {}).get("fingerprint") or {}
        run = self.options.runner
        return self.profile.workload.sizes(fingerprint.get("inputs"), (run.batch_size, run.seq_len))

    @property
    def baseline(self) -> Measurement | None:
        """The search's measurement of the baseline (one, at its own moment: see `compared`)."""
        return self.on_run_peak(trial_measurement(self.study, self.verification.baseline_trial))

    @property
    def best(self) -> Measurement | None:
        """The search's best feasible measurement (which may not have been verified)."""
        return self.on_run_peak(trial_measurement(self.study, self.verification.best_trial))

    @property
    def chosen(self) -> Measurement | None:
        """The search's measurement of the recommended setting (None: a best trimmed of its harmful
        knobs that the search never measured, tuning/verify/trim.py)."""
        v = self.verification
        if v.recommends_trimmed:
            number = v.trim.trial if v.trim is not None else None
            return self.on_run_peak(trial_measurement(self.study, number))
        return self.best if v.chosen_is_best else self.baseline

    @property
    def compared(self) -> ComparedSteps:
        """Baseline and tuned as shown beside the verified speedup: steady steps (and the MFU of
        them, on the run's peak) from the verification window where there is one, so that their
        ratio agrees with the speedup; else the search's figures (not verified, verification
        failed, or a result.json written before the window was stored)."""
        v, base, chosen = self.verification, self.baseline, self.chosen
        window, samples = v.window, v.samples
        if v.recommends_trimmed and v.trim is not None:
            # The trimmed setting's own window against the baseline, where it ran.
            samples = {"baseline": v.trim.samples.get("baseline", []), "best": v.trim.samples.get(TRIMMED, [])}
            window = WindowFigures.of(samples)
        if window is None or base is None or chosen is None:
            return ComparedSteps(base, chosen, from_window=False, why_search=self._why_search(window, chosen))
        run_peak = self.peak
        # Not significant: the recommendation is the baseline, so "tuned" is its window figure too.
        tuned_label, tuned_step = ("best", window.best) if v.recommends_tuned else ("baseline", window.baseline)
        return ComparedSteps(
            self.on_run_peak(with_window_step(base, window.baseline, samples.get("baseline", ())), run_peak),
            self.on_run_peak(with_window_step(chosen, tuned_step, samples.get(tuned_label, ())), run_peak),
            from_window=True,
            rounds=window.baseline.rounds,
        )

    def _why_search(self, window: WindowFigures | None, chosen: Measurement | None) -> str:
        """Why the figures shown are the search's, not a window's."""
        v = self.verification
        if v.recommends_trimmed and v.trim is not None:
            without = f"the best without {', '.join(v.trim.dropped)}"
            if chosen is None:
                return f"the recommended setting, {without}, was never measured by the search: its column is empty"
            if window is None:
                return f"the recommended setting, {without}, was not re-measured in a window of its own"
        if window is None and v.speedup is not None:
            return "this result.json predates the window's stored figures"
        return "no interleaved verification window"

    @property
    def step_disagreements(self) -> list[str]:
        """Where the search's step of the baseline or the recommended setting disagrees with the
        window's beyond their spreads, said with the figure that stands (tuning/verify/window_figures.py)."""
        compared = self.compared
        if not compared.from_window:
            return []
        sides = [("baseline", self.baseline, compared.baseline)]
        if self.verification.recommends_tuned:
            sides.append(("recommended setting", self.chosen, compared.tuned))
        return [said for label, search, window in sides if (said := step_disagreement(label, search, window))]

    @property
    def window_marks(self) -> dict[int, WindowMark]:
        """Each trial whose setting the race or the verification timed again, by trial number:
        the window's step and whether the search's figure is superseded by it
        (tuning/verify/window_marks.py). The verification's figures win over the race's."""
        v, run_peak = self.verification, self.peak
        marks = race_marks(v.race)
        windows: list[tuple[int | None, dict[str, list[float]], str, str]] = [
            (v.baseline_trial, v.samples, "baseline", "the verification window"),
            (v.best_trial, v.samples, "best", "the verification window"),
        ]
        if v.trim is not None:
            windows.append((v.trim.trial, v.trim.samples, TRIMMED, "the trimmed setting's window"))
        for number, samples, label, where in windows:
            search = self.on_run_peak(trial_measurement(self.study, number), run_peak)
            if number is None or search is None or not samples.get(label):
                continue
            window = self.on_run_peak(with_window_step(search, WindowStep.of(samples[label]), samples[label]), run_peak)
            if window is not None:
                marks[number] = mark_against_window(search, window, where)
        return marks

    @property
    def best_config(self) -> TunedConfig:
        """The recommended config (the baseline when the win was not significant)."""
        return TunedConfig(
            self.verification.chosen, self.profile.device.kind, self._provenance(), bucketing=self.chosen_bucketing()
        )

    def chosen_bucketing(self) -> dict[str, Any] | None:
        """The buckets of the chosen setting's trial, when the inputs vary (tuning/search/bucketing_context.py)."""
        chosen = self.verification.chosen.to_dict()
        for t in self.trials():
            if t.buckets and t.candidate == chosen:
                from tpu_tuner.model.buckets.torchtpu_buckets import torchtpu_instructions

                return {
                    "buckets": list(t.buckets),
                    "align": self.options.objective.bucket_align,
                    "padding_waste": t.padding_waste,
                    "torchtpu": torchtpu_instructions(list(t.buckets)),
                }
        return None

    def trials_dataframe(self) -> pd.DataFrame:
        """One row per trial: settings, outcome, objective, measurements, failures (trials_table.py)."""
        marks = {number: mark.columns() for number, mark in self.window_marks.items()}
        return trials_frame(self.study, self.space, self.on_run_peak, marks)

    def to_json(self) -> str:
        """result.json: what `load` needs besides the study and profile.json (the verification,
        the agents' findings, the options and the space). No password: the options' storage URL
        is stored without one and the whole text goes through `redact` (docs/run-safety.md)."""
        record = {
            "format": RESULT_FORMAT,
            "created": self.created,
            "worker_starts": self.worker_starts,
            "findings": self.findings,
            "space": dataclasses.asdict(self.space),
            "options": self.options.to_plain(),
            "verification": dataclasses.asdict(self.verification),
        }
        return redact(json.dumps(record, indent=2, default=json_default))

    @classmethod
    def load(cls, run_dir: str | Path, storage: str | None = None) -> TuningResult:
        """The result of the finished tuning run in `run_dir`, as `tune` returned it (as Ray
        Tune's `Tuner.restore(...).get_results()` gives back a finished experiment).

        The study comes from the run's storage: study.db in the folder (even if the folder was
        moved), or the stored URL, which never holds a password; give `storage` (the URL with
        its password, same database) where the database needs one that libpq's PGPASSWORD or
        ~/.pgpass does not supply. Raises UserInputError, naming the folder, when `run_dir` is
        not a finished tuning run.
        """
        run_dir = Path(run_dir)
        state, record = read_finished_run(run_dir)
        try:
            profile = Profile.from_json((run_dir / run_folder.PROFILE_JSON).read_text())
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise UserInputError(f"unreadable {run_folder.PROFILE_JSON}: {first_line(exc)}", run_dir) from exc
        try:
            options = TuneOptions.from_plain(record["options"])
            verification = from_plain(Verification, record["verification"])
            findings = {str(k): list(v) for k, v in record["findings"].items()}
            worker_starts, created = int(record["worker_starts"]), str(record["created"])
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise UserInputError(f"unreadable {run_folder.RESULT_JSON}: {first_line(exc)}", run_dir) from exc
        study, url = load_study(run_dir, state, storage)
        return cls(
            run_dir=run_dir,
            study=study,
            space=load_space(record.get("space"), options, profile),
            profile=profile,
            findings=findings,
            verification=verification,
            options=options,
            worker_starts=worker_starts,
            created=created,
            storage_url=url,
        )

    def _provenance(self) -> dict[str, Any]:
        v = self.verification
        compared, planned = self.compared, self.options.objective.planned_steps
        return {
            "created": self.created,
            "device": self.profile.device.name,
            "device_count": self.profile.device.count,
            "versions": {
                "tpu_tuner": __version__,
                "torch": torch.__version__,
                "optuna": version("optuna"),
                "python": platform.python_version(),
            },
            "workload": self.profile.workload.to_dict(),
            "objective": f"amortised step time over {self.options.objective.planned_steps} planned steps",
            "ranks": self.options.runner.ranks,
            **({"hosts": self.options.runner.nnodes} if self.options.runner.nnodes > 1 else {}),
            "tolerance": self.options.objective.tolerance,
            "accuracy_error": self.chosen.accuracy_error if self.chosen else None,
            "baseline": _summary(compared.baseline, planned, compared, self.baseline),
            "tuned": _summary(compared.tuned, planned, compared, self.chosen),
            "verification": {
                "message": v.message,
                "speedup": v.speedup.speedup if v.speedup else None,
                "ci_low": v.speedup.ci_low if v.speedup else None,
                "ci_high": v.speedup.ci_high if v.speedup else None,
                "rounds": v.speedup.rounds if v.speedup else None,
                "significant": v.recommends_tuned,
                "dropped_knobs": v.trim.dropped if v.recommends_trimmed and v.trim is not None else [],
                "verdict": str(v.verdict_kind),
                "disturbed_rounds": [d.round for d in v.disturbed_rounds],
            },
            "study": {
                "storage": _redact(self.storage_url),
                "name": self.study.study_name,
                "trials": len(self.study.trials),
            },
        }


def _summary(
    m: Measurement | None, planned_steps: int, compared: ComparedSteps, search: Measurement | None
) -> dict[str, Any] | None:
    """One side of the provenance's comparison: its steps and MFU from `compared.source`, and
    (from a window) the search's own step and MFU beside them; compile time is the search's."""
    if m is None:
        return None
    summary: dict[str, Any] = {
        "step_median_s": m.step_median,
        "step_p10_s": m.step_p10,
        "step_p90_s": m.step_p90,
        "step_source": compared.source,
        "compile_s": m.compile_seconds,
        "amortised_step_s": m.amortised_step(planned_steps),
        "mfu": m.mfu,
        "peak_flops_per_s": m.peak_flops_per_s,  # the run's one peak, which a trial may have raised
        "peak_dtype": m.peak_dtype,
        "peak_memory_bytes": m.peak_memory_bytes,
        "accuracy_error": m.accuracy_error,
    }
    if compared.from_window and search is not None:
        summary.update(window_rounds=compared.rounds, search_step_median_s=search.step_median, search_mfu=search.mfu)
    return summary


def _redact(url: str | None) -> str:
    """A storage URL to show (None: Optuna's in-memory storage, by the name it always had here)."""
    if url is None:
        return "InMemoryStorage"
    # Never write a password: the one redaction every writer uses (credentials.py).
    return redact(url)


__all__ = ["TuningResult"]
