"""run.json: a tuning run's identity and state, written through one place.

It holds the study's storage URL without its password, the study name, the workload fingerprint
(fingerprint.py), and the run's state: "running" (with the pid and host of the process, so that
the dashboard can tell a dead run from a live one), "done", or "failed" with the reason.
Every write goes through `credentials.redact`, so no password reaches the file. It carries the
`format` it was written in: a version of tpu-tune refuses to resume a folder of a newer format
(`check_format`) rather than guess at fields it does not know.
"""

from __future__ import annotations

import json
import os
import socket
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

from tpu_tuner.core.credentials import redact, without_password
from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.run_folder import RUN_JSON, write_atomic
from tpu_tuner.studies import run_lock

RUN_FILE = RUN_JSON  # the name lives with every other run-folder file name (tpu_tuner/core/run_folder.py)
# The run.json format this version writes and reads. 1: before the field existed (absent).
FORMAT = 2


def write(run_dir: Path, data: dict[str, Any]) -> None:
    """Write run.json (atomically: a reader never sees half a file)."""
    write_atomic(Path(run_dir) / RUN_FILE, redact(json.dumps(data, indent=2, default=str)))


def read(run_dir: Path) -> dict[str, Any]:
    """The run.json of `run_dir` (an empty dict when unreadable)."""
    try:
        data = json.loads((Path(run_dir) / RUN_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def update(run_dir: Path, **fields: Any) -> None:
    """Merge `fields` into run.json."""
    write(run_dir, {**read(run_dir), **fields})


def start(
    run_dir: Path, storage: str, study_name: str, shared: bool, model_file: Path | str, fingerprint: dict[str, Any]
) -> None:
    """Write a new run's run.json: its study (the storage URL without its password), its workload,
    and this process running it."""
    write(
        run_dir,
        {
            "format": FORMAT,
            "storage": without_password(storage),
            "study_name": study_name,
            "shared": shared,
            "model_file": str(model_file),
            "fingerprint": fingerprint,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            **this_process(),
        },
    )


def check_format(run_dir: Path, data: dict[str, Any]) -> None:
    """Refuse (`UserInputError`, one line) a run.json of a format newer than this version reads."""
    written = data.get("format", 1)
    if not isinstance(written, int) or isinstance(written, bool) or written > FORMAT:
        fingerprint = data.get("fingerprint")
        versions = fingerprint.get("versions") if isinstance(fingerprint, dict) else None
        version = versions.get("tpu-tune") if isinstance(versions, dict) else None
        by = f"tpu-tune {version}" if version else "a newer tpu-tune"
        raise UserInputError(
            f"resume refused: {RUN_FILE} is of format {written!r}, written by {by}; this version reads up to "
            f"format {FORMAT}: resume it with that version",
            run_dir,
        )


def check_resumable(run_dir: Path) -> None:
    """Refuse in one line (`UserInputError`), writing nothing, a `--resume` of `run_dir` whose
    run.json is of a newer format, whose SQLite study is damaged, or whose run another process
    holds: checked before the model loads, and again by the resume itself under the lock."""
    from tpu_tuner.studies.storage import check_sqlite_study

    saved = read(run_dir)
    check_format(run_dir, saved)
    storage = saved.get("storage")
    if isinstance(storage, str) and storage.startswith("sqlite"):
        check_sqlite_study(storage)
    run_lock.check_free(run_dir)


def end(run_dir: Path, status: str, **fields: Any) -> None:
    """Record how the run ended ("done", "searched", "failed") with `fields` (a reason), and let
    another process resume it."""
    try:
        update(run_dir, status=status, **fields, updated=time.strftime("%Y-%m-%dT%H:%M:%S"))
    finally:
        run_lock.release(run_dir)


def this_process() -> dict[str, Any]:
    """The fields that say which process is running the run now."""
    return {
        "status": "running",
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "reason": None,
        "updated": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def mark_failed(run_dir: Path, exc: BaseException) -> None:
    """Record that the run stopped on `exc` (never raises: the original error matters more)."""
    if isinstance(exc, KeyboardInterrupt):
        reason = "interrupted (Ctrl-C); continue it with --resume"
    else:
        reason = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:500]
    with suppress(OSError):
        end(run_dir, "failed", reason=reason)


def process_alive(data: dict[str, Any]) -> bool | None:
    """Whether the process run.json names is alive: None when that cannot be known here (no
    pid recorded, or another host)."""
    pid, host = data.get("pid"), data.get("host")
    if not isinstance(pid, int) or host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True


__all__ = [
    "FORMAT",
    "RUN_FILE",
    "check_format",
    "end",
    "mark_failed",
    "process_alive",
    "read",
    "start",
    "this_process",
    "update",
    "write",
]
