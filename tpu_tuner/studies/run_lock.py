"""One process at a time runs a run folder: an exclusive `flock` on its ``run.lock``, held from
the moment the folder is made (or resumed) until the run ends, and released by the kernel when the
process dies however it dies (SIGKILL included: no stale lock to clear by hand).

A `--resume` of a folder another process holds is refused in one line naming the holder (its pid
and host, which the holder writes into the lock file), before anything in the folder is written.
A filesystem without `flock` (some network mounts) leaves the run unlocked, with a warning.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import IO

from tpu_tuner.core.errors import UserInputError

log = logging.getLogger(__name__)

RUN_LOCK = "run.lock"

# The lock files this process holds, by run folder: a second acquire by the holder is a no-op
# (a new open file description of the same file would conflict with the first).
_held: dict[Path, IO[str]] = {}


def acquire(run_dir: Path) -> None:
    """Hold `run_dir` for this process, or raise `UserInputError` naming the process holding it."""
    key = Path(run_dir).resolve()
    if key in _held:
        return
    handle = (key / RUN_LOCK).open("a+")  # never truncated here: a refused process changes nothing
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        handle.seek(0)
        holder = handle.read()
        handle.close()
        if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
            log.warning("%s: cannot lock the run folder (%s): not protected from a second --resume", run_dir, exc)
            return
        raise UserInputError(f"resume refused: the run is held by {_describe(holder)}; stop it first", run_dir) from exc
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%H:%M:%S")}))
    handle.flush()
    _held[key] = handle


def check_free(run_dir: Path) -> None:
    """Raise `UserInputError` naming the holder when another process holds `run_dir` (a look:
    nothing is created or written, and the lock is let go at once)."""
    key = Path(run_dir).resolve()
    if key in _held:
        return
    try:
        handle = (key / RUN_LOCK).open("r")
    except FileNotFoundError:
        return  # never run by a version that locks, or never locked: nobody holds it
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise UserInputError(
                    f"resume refused: the run is held by {_describe(handle.read())}; stop it first", run_dir
                ) from exc
        # Closing lets go of a lock taken here.


def release(run_dir: Path) -> None:
    """Let another process run `run_dir` (the run ended here)."""
    handle = _held.pop(Path(run_dir).resolve(), None)
    if handle is not None:
        handle.close()  # closing the only descriptor releases the flock


def _describe(holder: str) -> str:
    try:
        data = json.loads(holder)
        return f"process {data['pid']} on {data['host']} (since {data['since']})"
    except (ValueError, KeyError, TypeError):
        return "another process"


__all__ = ["RUN_LOCK", "acquire", "check_free", "release"]
