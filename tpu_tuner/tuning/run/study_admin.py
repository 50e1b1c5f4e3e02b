"""`tpu-tune study status` and `tpu-tune study finish`: a shared study seen and closed from any host.

`status` reads the study and says how far it is: trials by state, per worker and host, the
budget, the best so far, and whether it was verified. `finish` verifies the study's best once,
on this host (interleaved against the baseline, like a worker that completes the budget), and
writes a run folder with the tuned config; when a worker has verified it already, it writes the
folder from that recorded verification without measuring again. It finishes through a tuning
run's own last phases (tuning/run/phases.py: `race_and_verify`, `finish`), on a `Searched` made
from the study's record.
"""

from __future__ import annotations

import logging
import socket
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna

from tpu_tuner.core.credentials import redact, without_password
from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.plain_data import from_plain
from tpu_tuner.core.run_folder import new_run_dir
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.runner.load import load_summary
from tpu_tuner.runner.ranked_runner import RankedTrialRunner, trial_runner
from tpu_tuner.studies import run_file
from tpu_tuner.studies.coverage import covered_settings, measured_count
from tpu_tuner.studies.fingerprint import file_sha256, fingerprint
from tpu_tuner.studies.liveness import (
    HEARTBEAT_INTERVAL_S,
    StudyStorage,
    fail_lost_trials,
    is_lost,
    open_storage,
    set_liveness,
)
from tpu_tuner.tuning.options.tune_options import TuneOptions
from tpu_tuner.tuning.run import phases
from tpu_tuner.tuning.run.clock import Clock
from tpu_tuner.tuning.run.phases import OutputsWriter, Run, Searched, Verified
from tpu_tuner.tuning.run.run_setup import prepare_agents, start_ranks_on
from tpu_tuner.tuning.run.shared_study import PROFILE_ATTR, RECORD_ATTR, join_differences, recorded_verification
from tpu_tuner.tuning.run.tuning_result import TuningResult
from tpu_tuner.tuning.search.failure_learning import label, stored_causes, stored_not_blamed
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.search.tuning_trial import TuningTrial
from tpu_tuner.tuning.verify.verification import Verification

log = logging.getLogger(__name__)


@dataclass
class WorkerTally:
    """One worker's share of a study."""

    worker: str
    host: str
    measured: int = 0
    running: int = 0
    lost: int = 0


@dataclass
class StudyStatus:
    """How far a shared study is."""

    name: str
    storage: str  # without its password
    budget: int | None
    measured: int  # distinct settings measured (the budget's count)
    states: dict[str, int]
    lost: int  # trials failed because their worker stopped beating
    workers: list[WorkerTally] = field(default_factory=list)
    best_value: float | None = None
    best_label: str | None = None
    best_host: str | None = None
    verification: dict[str, Any] | None = None
    # What the search learned (tuning/search/failure_learning.py, tuning/search/pruning.py): each cause in words,
    # the failure kinds blamed on no value, and how many trials were stopped early or asked for an excluded
    # setting (never measured).
    exclusions: list[str] = field(default_factory=list)
    not_blamed: list[str] = field(default_factory=list)
    stopped_early: int = 0
    excluded_asks: int = 0

    def lines(self) -> list[str]:
        """The status as the CLI prints it."""
        budget = f"of a budget of {self.budget}" if self.budget else "(no budget recorded)"
        states = ", ".join(f"{count} {state.lower()}" for state, count in sorted(self.states.items())) or "no trials"
        out = [
            f"study {self.name!r} in {self.storage}",
            f"  measured  {self.measured} settings {budget}; trials: {states}"
            + (f" ({self.lost} lost with their worker)" if self.lost else ""),
        ]
        out += [
            f"  worker    {w.worker}: {w.measured} measured, {w.running} running"
            + (f", {w.lost} lost" if w.lost else "")
            for w in self.workers
        ]
        out.append(
            f"  best      {self.best_value * 1e3:.2f} ms amortised: {self.best_label} (measured on {self.best_host})"
            if self.best_value is not None
            else "  best      none feasible yet"
        )
        out += [f"  excluded  {words}" for words in self.exclusions]
        out += [f"  not blamed {words}" for words in self.not_blamed]
        if self.stopped_early or self.excluded_asks:
            out.append(
                f"  pruned    {self.stopped_early} trial(s) stopped early, hopeless against the best so far; "
                f"{self.excluded_asks} ask(s) of an excluded setting told without measuring"
            )
        v = self.verification
        out.append(
            "  verified  not yet (the worker that completes the budget verifies; or `tpu-tune study finish`)"
            if v is None
            else f"  verified  on {v.get('host')} by {v.get('worker')}: {v.get('message')} ({v.get('run_dir')})"
        )
        return out


def load_named_study(storage: str, name: str) -> tuple[optuna.Study, StudyStorage]:
    """The tpu-tune study `name` in `storage` and the storage (with heartbeats), or a one-line
    UserInputError."""
    if storage.startswith("sqlite:///") and not Path(storage.removeprefix("sqlite:///")).is_file():
        # Opening it would create an empty database: say there is none instead.
        raise UserInputError(f"no study {name!r}: {redact(storage)} does not exist")
    try:
        rdb = open_storage(storage)
        study = optuna.load_study(study_name=name, storage=rdb)
    except KeyError as exc:
        raise UserInputError(f"no study {name!r} in {redact(storage)}") from exc
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise UserInputError(
            redact(f"cannot open the study storage {storage!r}: {type(exc).__name__}: {first}")
        ) from exc
    if not isinstance(study.user_attrs.get(RECORD_ATTR), dict):
        raise UserInputError(f"study {name!r} in {redact(storage)} was not made by tpu-tune (no {RECORD_ATTR} record)")
    return study, rdb


def study_status(storage: str, name: str) -> StudyStatus:
    """The status of the study `name` (read only: fails no trial, writes nothing)."""
    study, _ = load_named_study(storage, name)
    record = study.user_attrs[RECORD_ATTR]
    trials = study.get_trials(deepcopy=False)
    states = Counter(t.state.name for t in trials)
    tallies: dict[str, WorkerTally] = {}
    read = TuningTrial.all(trials)
    for t, r in zip(trials, read):
        worker = r.claims.worker
        if worker is None:
            continue
        tally = tallies.setdefault(worker, WorkerTally(worker, r.claims.host or "?"))
        tally.measured += int(r.measured and not r.is_repeat)
        tally.running += int(r.state == optuna.trial.TrialState.RUNNING)
        tally.lost += int(is_lost(t))
    feasible = [r for r in read if r.is_feasible and r.value is not None]
    best = min(feasible, key=lambda r: r.objective) if feasible else None
    options = record.get("options", {})
    return StudyStatus(
        name=name,
        storage=redact(without_password(storage)),
        budget=options.get("trials"),
        measured=measured_count(covered_settings(trials)),
        states=dict(states),
        lost=sum(1 for t in trials if is_lost(t)),
        workers=list(tallies.values()),
        best_value=best.value if best else None,
        best_label=_label(best) if best else None,
        best_host=(best.claims.host or "?") if best else None,
        verification=recorded_verification(study),
        exclusions=[cause.describe(label) for cause in stored_causes(study.user_attrs)],
        not_blamed=[note.describe() for note in stored_not_blamed(study.user_attrs)],
        stopped_early=sum(1 for r in read if r.stopped_early is not None and not r.is_repeat),
        excluded_asks=sum(1 for r in read if r.excluded_by is not None),
    )


def finish_study(
    storage: str,
    name: str,
    out: Path,
    model_file: Path | None = None,
    device: str | None = None,
    now: bool = False,
    *,
    write_outputs: OutputsWriter,
) -> TuningResult:
    """Verify the best of study `name` once, on this host, and write a run folder (tuned config,
    report, trials); from the recorded verification when a worker verified the study as it is.
    Refused while trials are running (their workers are alive: the one that completes the budget
    verifies), unless `now`."""
    study, rdb = load_named_study(storage, name)
    record = study.user_attrs[RECORD_ATTR]
    recorded_options = dict(record.get("options", {}))
    set_liveness(
        rdb,
        int(recorded_options.get("heartbeat_interval_s") or HEARTBEAT_INTERVAL_S),
        recorded_options.get("grace_period_s"),
    )
    running = [t for t in fail_lost_trials(study, rdb) if t.state == optuna.trial.TrialState.RUNNING]
    if running and not now:
        hosts = sorted({TuningTrial.of(t).claims.host or "?" for t in running})
        raise UserInputError(
            f"study {name!r}: {len(running)} trial(s) still running (on {', '.join(hosts)}); the worker "
            "that completes the budget verifies. Give --now to verify what is measured so far"
        )
    profile_data = study.user_attrs.get(PROFILE_ATTR)
    if not isinstance(profile_data, dict):
        raise UserInputError(
            f"study {name!r}: no baseline profile recorded yet (its first worker is still profiling, "
            "or died before it finished)"
        )
    profile = Profile.from_dict(profile_data)
    options = TuneOptions.from_plain(recorded_options)
    options = replace(
        options,
        store=replace(options.store, url=storage, resume=None, study=name),
        outputs=replace(options.outputs, out=out),
        runner=replace(options.runner, device=device if device is not None else options.runner.device),
    )
    run = options.runner
    # Its trials ran on several hosts; a verification on this one alone would measure another machine.
    if run.nnodes > 1:
        raise UserInputError(
            f"study {name!r} runs each trial on {run.nnodes} hosts: its driver verifies it when the "
            "search ends (relaunch the hosts' command to finish it)"
        )
    recorded_fingerprint = record.get("fingerprint", {})
    model_file = model_file or Path(str(recorded_fingerprint.get("model_file", "")))
    if not model_file.is_file():
        raise UserInputError(f"study {name!r}: its model file is not here (give --model FILE)", model_file)
    if file_sha256(model_file) != recorded_fingerprint.get("sha256"):
        raise UserInputError(f"study {name!r}: not the model file the study measured (sha256 differs)", model_file)
    with trial_runner(
        str(model_file), run.device, run.nproc, run.trial_timeout_s, options.objective.memory_limit_bytes
    ) as runner:
        workload = load_summary(
            runner, model_file, run.batch_size, run.seq_len, sample_lengths=options.objective.lengths_file is None
        )
        current = fingerprint(model_file, workload, run.batch_size, run.seq_len, run.nproc)
        whole_space = SearchSpace.load(options.search.space, workload.device_kind, ranks=run.nproc)
        differing = join_differences(record, current, whole_space)
        if differing:
            raise UserInputError(f"study {name!r}: cannot verify it here: {'; '.join(differing)}")
        run_dir = new_run_dir(out, workload.name, "tune")
        runner.log.move_into(run_dir)  # the workers' output, kept off the terminal
        run_file.start(run_dir, storage, name, True, model_file, current)
        try:
            # No clock (the trial budget alone) and no progress lines: the CLI prints the verdict.
            finishing = Run(runner, Clock(None, time.perf_counter()), lambda event: None)
            searched = _searched(finishing, run_dir, study, rdb.url, options, profile)
            result = phases.finish(finishing, _verified(finishing, searched), write_outputs)
        except BaseException as exc:
            run_file.mark_failed(run_dir, exc)
            raise
    run_file.end(run_dir, "done")
    return result


def _searched(
    run: Run, run_dir: Path, study: optuna.Study, storage_url: str, options: TuneOptions, profile: Profile
) -> Searched:
    """The study as a worker's search would have left it for its finish: the space narrowed to
    the recorded profile, the agents having read it, the ranks given their devices."""
    if isinstance(run.runner, RankedTrialRunner):
        start_ranks_on(run.runner, profile, options.runner.nproc)
    space = SearchSpace.for_profile(options.search.space, profile, ranks=options.runner.nproc)
    agents, findings, _ = prepare_agents(options, profile, space)
    recorder = f"study finish on {socket.gethostname()}"
    return Searched(study, storage_url, space, profile, agents, findings, options, run_dir, recorder)


def _verified(run: Run, searched: Searched) -> Verified:
    """The verification a worker recorded for the study as it stands, else one measured here."""
    measured = measured_count(covered_settings(searched.study.get_trials(deepcopy=False)))
    done = recorded_verification(searched.study)
    if done is None or done.get("measured") != measured:
        return phases.race_and_verify(run, searched)
    log.info(
        "the study was verified on %s (%s): writing the config from that verification",
        done.get("host"),
        done.get("run_dir"),
    )
    return Verified(searched, from_plain(Verification, done), measured_here=False, measured=measured)


def _label(trial: TuningTrial) -> str:
    from tpu_tuner.knobs.candidate import Candidate

    candidate = trial.candidate
    if isinstance(candidate, dict):
        try:
            return Candidate.from_dict(candidate).describe()
        except (TypeError, ValueError, KeyError):
            pass
    return ", ".join(f"{k}={v}" for k, v in sorted(trial.params.items()))


__all__ = ["StudyStatus", "WorkerTally", "finish_study", "load_named_study", "study_status"]
