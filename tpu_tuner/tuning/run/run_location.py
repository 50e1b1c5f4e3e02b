"""Where a tuning run keeps its files and its study: a new run folder or a resumed one, the
storage URL to connect with (a password never written), the study's name, and the study opened,
created or joined (the `store` and `outputs` sections of the options)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna

from tpu_tuner.core.credentials import password_of, redact, with_password, without_password
from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.run_folder import STUDY_DB, new_run_dir
from tpu_tuner.studies import records, run_file, run_lock
from tpu_tuner.studies.fingerprint import differences
from tpu_tuner.studies.liveness import StudyStorage, open_storage, trial_id_of
from tpu_tuner.studies.opening import OpenedStudy, open_study
from tpu_tuner.studies.run_file import RUN_FILE
from tpu_tuner.studies.storage import (
    STORAGE_ENV,
    check_sqlite_study,
    check_storage,
    shared_sqlite,
    storage_from_environment,
)
from tpu_tuner.studies.trial_record import write_stored
from tpu_tuner.tuning.options.tune_options import StoreOptions, TuneOptions
from tpu_tuner.tuning.run.shared_study import RECORD_ATTR, open_shared
from tpu_tuner.tuning.search.search_space import SearchSpace

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunLocation:
    """Where a run keeps its files and its study: the storage URL may carry a password (it is
    used to connect, never written); `shared` for a study joined by name (`--study`)."""

    run_dir: Path
    storage: str
    study_name: str
    shared: bool
    resumed: bool


def run_location(name: str, options: TuneOptions, current: dict[str, Any]) -> RunLocation:
    """The run folder, the storage URL to connect with, and the study name.

    A new run gets a fresh folder and a run.json; a resumed one is checked first (same workload
    fingerprint, same storage) and refused with nothing rewritten when it differs. The URL
    returned may carry a password (from --storage); the one written never does. A worker of a
    shared study (`--study NAME`) has a folder of its own too: its report, its trials' view.
    """
    store, out = options.store, options.outputs.out
    if store.resume is not None:
        return resumed_location(Path(store.resume), store, current)
    run_dir = new_run_dir(out, name, "tune")
    run_lock.acquire(run_dir)  # held until the run ends (run_file.end): a --resume meanwhile is refused
    if store.study is not None:
        storage = store.url or shared_sqlite(out)
        study_name = store.study
    else:
        storage = store.url or f"sqlite:///{(run_dir / STUDY_DB).resolve()}"
        study_name = run_dir.name
    run_file.start(run_dir, storage, study_name, store.study is not None, current["model_file"], current)
    return RunLocation(run_dir, storage, study_name, shared=store.study is not None, resumed=False)


def resumed_location(run_dir: Path, store: StoreOptions, current: dict[str, Any]) -> RunLocation:
    """The location of the run folder `run_dir` resumed: refused in one line, with nothing in the
    folder or its study written, where its run.json is unreadable or of a newer format, another
    process holds the run (studies/run_lock.py), its workload differs, or its SQLite study is
    damaged (docs/run-safety.md, "Damaged state")."""
    saved = run_file.read(run_dir)
    run_file.check_format(run_dir, saved)
    if "storage" not in saved or "study_name" not in saved:
        raise UserInputError(f"not a tuning run folder (no readable {RUN_FILE})", run_dir)
    if str(saved["storage"]).startswith("sqlite"):
        check_sqlite_study(str(saved["storage"]))  # read-only: before the lock file is made
    run_lock.acquire(run_dir)
    try:
        return _resume_held(run_dir, saved, store, current)
    except BaseException:
        run_lock.release(run_dir)
        raise


def _resume_held(run_dir: Path, saved: dict[str, Any], store: StoreOptions, current: dict[str, Any]) -> RunLocation:
    where = f"{run_dir}/: resume refused"
    recorded = saved.get("fingerprint")
    if isinstance(recorded, dict):
        differing = differences(recorded, current)
        if differing:
            raise UserInputError(f"{where}: {'; '.join(differing)}")
    else:
        log.warning("%s has no workload fingerprint (written before fingerprints): resuming unchecked", run_dir)
    stored = str(saved["storage"])
    storage = stored
    given = store.url
    from_environment = storage_from_environment()
    if given is None and from_environment is not None:
        # $TPU_TUNE_STORAGE is ambient: its password is used where it names this run's database.
        if without_password(from_environment) == without_password(stored):
            given = from_environment
        else:
            log.info("$%s names another database than the run's: not used for this resume", STORAGE_ENV)
    if given is not None:
        # The password is never stored: it comes from --storage given again, which must name the
        # same database (or from libpq's PGPASSWORD / ~/.pgpass when the URL has none).
        if without_password(given) != without_password(stored):
            raise UserInputError(f"{where}: --storage {redact(given)!r} is not the run's storage {redact(stored)!r}")
        storage = with_password(stored, password_of(given))
    elif stored != without_password(stored):
        log.warning("%s stores its storage URL with a password (written before redaction)", run_dir)
    else:
        check_storage(stored)  # a stored server URL: reachable, before anything is rewritten
    run_file.update(run_dir, **run_file.this_process())
    return RunLocation(run_dir, storage, str(saved["study_name"]), shared=bool(saved.get("shared")), resumed=True)


def open_run_storage(url: str, store: StoreOptions) -> StudyStorage:
    """The study's storage, with heartbeats; a bad URL or an unreachable server in one line."""
    try:
        return open_storage(url, store.heartbeat_interval_s, store.grace_period_s, store.storage_retry_s)
    except Exception as exc:
        # Driver messages quote the URL, password included: redact the whole line.
        raise UserInputError(redact(f"cannot open the study storage {url!r}: {type(exc).__name__}: {exc}")) from exc


def open_or_join(
    storage: StudyStorage, location: RunLocation, record: dict[str, Any], space: SearchSpace
) -> OpenedStudy:
    """The run's study: created or joined by name when shared, else created (or reopened, on
    resume) under the run folder's name."""
    # A placeholder sampler: the run sets the real one once the space is narrowed.
    placeholder = optuna.samplers.RandomSampler()
    try:
        if location.shared:
            return open_shared(storage, location.study_name, placeholder, record, space)
        opened = open_study(storage, location.study_name, "minimize", RECORD_ATTR, record, placeholder)
    except UserInputError:
        raise
    except Exception as exc:
        raise UserInputError(
            redact(
                f"cannot open the study {location.study_name!r} in {location.storage!r}: {type(exc).__name__}: {exc}"
            )
        ) from exc
    # A run's own study: this worker is its only one, and keeps its record.
    return replace(opened, record=opened.record or record)


def mark_interrupted(study: optuna.Study, storage: optuna.storages.BaseStorage) -> None:
    """Trials left RUNNING by an interrupted run are failed, so that resume repeats none.

    `storage` is the one `study` was opened with: a trial of another process is annotated
    through it, by the trial's storage id (Optuna opens no `Trial` on a stored trial publicly)."""
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        write_stored(
            storage,
            trial_id_of(storage, study, trial.number),
            trial,
            {
                records.FAILURE_KIND: records.INTERRUPTED,
                records.FAILURE_MESSAGE: "the run stopped while this trial was running",
            },
        )
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)


__all__ = ["RunLocation", "mark_interrupted", "open_or_join", "open_run_storage", "resumed_location", "run_location"]
