"""Run folders: results/<model>-<kind>-<timestamp>/, one per run, never overwritten, and the
names of every file a run folder holds, and the one writer of them that readers can poll
(`write_atomic`).

The names live here, in a module that imports nothing heavy, so that the writers
(`tpu_tuner.outputs.write`), the readers (`TuningResult.load`, the dashboard's collector) and the
tuning loop (run.json, study.db) all spell a file the same way.
"""

from __future__ import annotations

import errno
import os
import re
import threading
from contextlib import suppress
from datetime import datetime
from pathlib import Path

from tpu_tuner.core.errors import TpuTuneError

# The results folder every command writes its run folders under unless told otherwise (--out).
RESULTS_DIR = "results"

# Every run whose model file runs in workers (tune, profile, buckets): what the workers' libraries
# print (inductor's autotune tables, the profiler's lines), kept off the terminal (runner/worker_log.py).
WORKERS_LOG = "workers.log"
# The same runs on a TPU host: what TorchTPU and libtpu write in the tpu-tune process itself (its
# start-up lines), kept off the terminal (core/device_log.py).
DEVICE_LOG = "device.log"

# `tpu-tune profile` (and `tpu_tuner.outputs.write.save_profile`); a tuning run holds its baseline
# profile.json too.
PROFILE_JSON = "profile.json"  # every figure of the profile (schema: tpu_tuner.Profile)
PROFILE_MD = "profile.md"

# A tuning run (`tpu-tune MODEL.py`, `tpu_tuner.tune`).
RUN_JSON = "run.json"  # storage URL (no password), study name, fingerprint, run state
STUDY_DB = "study.db"  # the Optuna study, when the storage is the default SQLite in the folder
RESULT_JSON = "result.json"  # what TuningResult.load needs besides the study: verification, options, ...
TUNED_CONFIG = "tuned_config.toml"  # the recommendation; its presence marks a finished run
REPORT_MD = "report.md"
TRIALS_CSV = "trials.csv"
HISTORY_PNG = "optimisation_history.png"
MFU_PNG = "mfu_per_trial.png"
ACCURACY_PNG = "speed_vs_accuracy.png"

# `tpu-tune plan`.
PLAN_JSON = "plan.json"
PLAN_MD = "plan.md"
PLAN_PNG = "predicted_mfu.png"
SHARDING_CONFIG = "sharding_config.toml"  # only when a layout fits
COMPILER_LOG = "compiler.log"  # the compiler processes' own output (libtpu's logs)
PLANS_DB = "plans.db"  # the planner's Optuna studies (its searches), shared by the plans of one results folder

# `tpu-tune buckets`.
BUCKETS_JSON = "buckets.json"
BUCKETS_MD = "buckets.md"
LENGTHS_PNG = "length_histogram.png"
STRATEGIES_PNG = "strategy_totals.png"
BUCKET_CONFIG = "bucket_config.toml"


# The errors of a write that found no room: the filesystem is full, or the user's quota is.
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(TpuTuneError, OSError):
    """A file could not be written: its filesystem is full (ENOSPC, or a quota: EDQUOT). An OSError
    too (its errno), so code that survives a failed write (run.json's "failed" mark) still does."""

    def __init__(self, path: str | Path, errno_: int = errno.ENOSPC) -> None:
        path = Path(path)
        OSError.__init__(self, errno_, os.strerror(errno_), str(path))
        self.message = (
            f"no space left on the device of {path.parent}/: {path.name} could not be written "
            f"(nothing half-written was left; free some space, then continue a tuning run with --resume {path.parent})"
        )

    def __str__(self) -> str:
        return self.message


def no_space_line(exc: BaseException) -> str | None:
    """One line for an error that says the disk is full where it was not written by `write_atomic`:
    an OSError (ENOSPC, EDQUOT: its file named) or SQLite's "database or disk is full", the error
    itself or any it was raised from (Optuna wraps SQLAlchemy's, which wraps sqlite3's); else None."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, DiskFull):
            return str(cause)
        if isinstance(cause, OSError) and cause.errno in NO_SPACE:
            return f"no space left on the device: {cause.filename or 'a file'} could not be written ({cause.strerror})"
        if "database or disk is full" in str(cause):
            return (
                "no space left on the device of the study's database: it could not be written (SQLite keeps "
                "it whole: its last transaction was rolled back); free some space, then continue the run with --resume"
            )
        cause = cause.__cause__ or cause.__context__
    return None


def write_atomic(path: str | Path, content: str | bytes) -> Path:
    """Write `content` to `path` through a temporary file in the same folder and `os.replace`:
    a reader polling the folder (the dashboard, a served page, another worker) sees the old file
    or the whole new one, never half of one. The temporary name is unique to this writer, so two
    processes writing the same file never interleave their bytes. A full disk raises `DiskFull`
    naming the folder and the file, the temporary file removed."""
    path = Path(path)
    data = content.encode("utf-8") if isinstance(content, str) else content
    # os.open with 0o666 keeps the umask's permissions (tempfile.mkstemp would make it 0600).
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666), "wb") as file:
            file.write(data)
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and not isinstance(exc, DiskFull) and exc.errno in NO_SPACE:
            raise DiskFull(path, exc.errno) from exc
        raise
    return path


def new_run_dir(root: str | Path, model: str, kind: str | None = None) -> Path:
    """Create and return a fresh run folder under `root`."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    safe_model = re.sub(r"[^A-Za-z0-9_.-]+", "_", model)
    base = "-".join(part for part in (safe_model, kind, stamp) if part)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for attempt in range(1000):
        candidate = root / (base if attempt == 0 else f"{base}-{attempt}")
        with suppress(FileExistsError):
            candidate.mkdir()
            return candidate
    raise RuntimeError(f"could not create a run folder under {root}")
