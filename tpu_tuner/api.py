"""The Python API's entry points that both run a feature and write its run folder.

A feature (tuning, the planner, bucketing) computes its result; the outputs layer writes it; this
module joins the two, so that `tpu_tuner.tune(...)` and `tpu-tune tune` leave the same folder.
"""

from __future__ import annotations

from pathlib import Path

from tpu_tuner.outputs.write import write_tuning
from tpu_tuner.tuning.options import TuneOptions
from tpu_tuner.tuning.result import TuningResult
from tpu_tuner.tuning.progress import ProgressCallback
from tpu_tuner.tuning.study import run_tuning
from tpu_tuner.tuning.study_admin import finish_study as _finish_study


def tune(model_file: str | Path, options: TuneOptions | None = None,
         progress: ProgressCallback | None = None) -> TuningResult:
    """Tune a model file; returns the result and writes the run folder.

    This process never imports the model file: a worker loads it and describes it. Bad options are
    refused before that, and a run that fails after its folder exists is marked "failed" in
    run.json with the reason (docs/run-safety.md). With `options.study` the run is one worker of a
    study shared by name (docs/tuning.md).
    """
    return run_tuning(model_file, options, progress, write_tuning)


def finish_study(storage: str, name: str, out: Path, model_file: Path | None = None,
                 device: str | None = None, now: bool = False) -> TuningResult:
    """Verify the best of shared study `name` once, on this host, and write its run folder
    (`tpu-tune study finish`)."""
    return _finish_study(storage, name, out, model_file, device, now, write_outputs=write_tuning)
