"""A tuning run: profile, let the agents shape the search, search with Optuna, verify.

The run is a sequence of named phases (tuning/run/phases.py), each taking the previous one's result;
this module opens what they share (the trial runner, the run's one clock, its progress) and marks
the run folder's end in run.json: "done", "searched" (another worker verifies), or "failed".

Trials run in an isolated worker (`TrialRunner`); the study lives in an Optuna storage (SQLite
in the run folder by default), so an interrupted run resumes without losing or repeating
completed trials.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path

from tpu_tuner.runner.hosts import HostGroup
from tpu_tuner.runner.multi_host import MultiHostTrialRunner
from tpu_tuner.runner.ranked_runner import trial_runner
from tpu_tuner.studies import run_file
from tpu_tuner.tuning.options.tune_options import TuneOptions, default_trial_settings
from tpu_tuner.tuning.run import phases
from tpu_tuner.tuning.run.clock import Clock
from tpu_tuner.tuning.run.phases import OutputsWriter, Run
from tpu_tuner.tuning.run.progress import ProgressCallback
from tpu_tuner.tuning.run.shared_study import JoinRefused
from tpu_tuner.tuning.run.tuning_result import TuningResult

log = logging.getLogger(__name__)


def run_tuning(
    model_file: str | Path,
    options: TuneOptions | None,
    progress: ProgressCallback | None,
    write_outputs: OutputsWriter,
    hosts: HostGroup | None = None,
) -> TuningResult:
    """Tune a model file; returns the result, with the run folder written by `write_outputs`.

    This process never imports the model file: a worker loads it and describes it
    (runner/load.py). Bad options are refused before that, and a run that fails after its
    folder exists is marked "failed" in run.json with the reason (docs/run-safety.md). With
    `options.store.study` the run is one worker of a study shared by name (tuning/run/shared_study.py).
    With `hosts` (the driver of a multi-host run, `runner/hosts.py`) every trial spans its hosts.
    The options are never changed: what the run resolves (the storage of $TPU_TUNE_STORAGE, the
    default trial settings, a shared study's options, the budget) makes new ones, and the result
    holds those the run used.
    """
    # Numbers, search space, storage URL: seconds, nothing written yet.
    options = (options or TuneOptions()).preflight()
    if options.runner.trial_settings is None:  # left to the run by the CLI: building it imports torch
        options = replace(options, runner=replace(options.runner, trial_settings=default_trial_settings()))
    # The run's one clock: from here (loading and profiling the model are in the budget), fitted
    # to the device when the profile phase ends, read by the search, the verification and the progress.
    clock = Clock(options.search.time_budget_s, time.perf_counter())
    given = options.runner
    with (
        trial_runner(
            str(model_file), given.device, given.nproc, given.trial_timeout_s, options.objective.memory_limit_bytes
        )
        if hosts is None
        else MultiHostTrialRunner(
            str(model_file), given.device, hosts, given.trial_timeout_s, options.objective.memory_limit_bytes
        )
    ) as runner:
        # The first worker loads the model before the run folder is named: it is inside the
        # device's caches from its start where the results folder and the device are known now.
        runner.cache_home = Path(options.store.resume).parent if options.store.resume else Path(options.outputs.out)
        runner.device_kind = expected_device_kind(given.device)
        run = Run(runner, clock, progress or (lambda event: None))
        started = phases.start(run, Path(model_file), options)
        location = started.location
        try:
            profiled = phases.profile(run, started)
            planned = phases.plan(run, profiled)
            searched = phases.search(run, planned)
            verified = phases.race_and_verify(run, searched)
            result = phases.finish(run, verified, write_outputs)
        except JoinRefused:
            if not location.resumed:
                shutil.rmtree(location.run_dir, ignore_errors=True)  # it never ran: nothing to keep
            raise
        except BaseException as exc:
            run_file.mark_failed(location.run_dir, exc)
            raise
    if result.verified:
        run_file.end(location.run_dir, "done")
    else:
        run_file.end(location.run_dir, "searched", reason=result.verification.message)
    run.say("done", f"results in {location.run_dir}")
    return result


def expected_device_kind(device: str | None) -> str | None:
    """The device kind the workers will run on where it is known before the model is loaded:
    the one asked for, or a TPU on a host whose PCI bus shows TPU chips (`--device auto` runs
    there or stops, never on its CPU); None where the load decides."""
    if device not in (None, "auto"):
        return device
    from tpu_tuner.core.tpu_host import tpu_chips_on_host

    return "tpu" if tpu_chips_on_host() else None


__all__ = ["expected_device_kind", "run_tuning"]
