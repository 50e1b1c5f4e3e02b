"""The workers' own output, kept in a log rather than on the user's terminal.

What the libraries in a worker print (inductor's max-autotune tables, "AUTOTUNE benchmarking
takes ...", the profiler's ``USDT: ... profiler_stop`` lines, libtpu's start-up logs) is written
from C as often as from Python, so it is caught at the file-descriptor level: the child's stdout
and stderr are one pipe, which a thread of the parent copies into the log (`WorkerProcess`
attaches it). The terminal is left to tpu-tune's own lines.

A tuning run's folder is made only after a worker loaded the model file, and that worker goes on
serving the trials; so a log may start in a temporary file and move into the run folder once it
is known (`move_into`): the pumps write on into the new file, and a resumed run appends to the
log already there. A temporary log is removed at `close`, unless a failure message pointed at
it (`failure_note`): a run that dies before its folder exists keeps its workers' last words.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path
from typing import IO

from tpu_tuner.core import device_log
from tpu_tuner.core.run_folder import NO_SPACE, WORKERS_LOG

log = logging.getLogger(__name__)

# How much of the log's end is read for its last telling line.
TAIL_BYTES = 64 * 1024
# How long a dead worker's remaining output is waited for before a message quotes the log.
DRAIN_S = 1.0

# Lines that name a failure: a Python exception ("ValueError: ..."), a C++ abort, a fatal signal.
_TELLING = re.compile(r"(\w+(Error|Exception|Interrupt): |terminate called|what\(\):|Fatal Python error)")


def telling_line(text: str, limit: int = 300) -> str:
    """The line of a process's output that says why it stopped: its last exception or C++ abort
    message (a fatal signal's dump lists stack frames and extension modules after it), else its
    last non-empty line; at most `limit` characters."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    telling = [line for line in lines if _TELLING.search(line)]
    chosen = telling[-1] if telling else (lines[-1] if lines else "")
    return chosen[:limit]


class WorkerLog:
    """One log file that every worker of a run writes its stdout and stderr into; `path` None
    starts it in a temporary file (see `move_into`). Use it as a context manager."""

    def __init__(self, path: str | Path | None = None) -> None:
        self._lock = threading.Lock()
        self._pumps: list[threading.Thread] = []
        self._keep = False
        self._file: IO[bytes] | None = None
        # The file offset of this log's first byte (a resumed run's log holds earlier runs), and
        # how many bytes it wrote since: `mark` and `failure_note` count in the latter.
        self._start = 0
        self._written = 0
        self.dropped = 0  # bytes of output not written: the log's disk was full
        self.temporary = path is None
        self.path = Path(path) if path is not None else Path()
        self.reopen()

    def reopen(self) -> None:
        """After `close`, write again: on to the same file, or to a new temporary one."""
        with self._lock:
            if self._file is not None:
                return
            if self.temporary:
                fd, name = tempfile.mkstemp(prefix="tpu-tune-workers-", suffix=".log")
                self._file, self.path, self._keep = os.fdopen(fd, "ab", buffering=0), Path(name), False
            else:
                self._file = open(self.path, "ab", buffering=0)
            self._start, self._written = self._file.seek(0, os.SEEK_END), 0

    def __enter__(self) -> WorkerLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def capture(self, stream: IO[bytes]) -> threading.Thread:
        """Copy `stream` (a child's stdout-and-stderr pipe) into the log until it ends; returns
        the thread doing it (a daemon: a grandchild holding the pipe never blocks exit)."""
        pump = threading.Thread(target=self._pump, args=(stream,), name="tpu-tune-worker-log", daemon=True)
        self._pumps = [thread for thread in self._pumps if thread.is_alive()] + [pump]
        pump.start()
        return pump

    def write(self, data: bytes) -> None:
        """Append `data` (what a process left in a file of its own, e.g. a rank's output)."""
        with self._lock:
            if self._file is None:
                return
            try:
                self._file.write(data)
            except OSError as exc:
                # A full disk must not stop the pump reading the child's pipe (a child blocked on a
                # full pipe would hang its trial): the output is dropped, said once.
                if exc.errno not in NO_SPACE:
                    raise
                if not self.dropped:
                    log.warning("%s: no space left on its device; the workers' output is dropped", self.path)
                self.dropped += len(data)
                return
            self._written += len(data)

    def mark(self) -> int:
        """Where the log ends now: `failure_note(since=mark)` quotes only what came after."""
        with self._lock:
            return self._written

    def move_into(self, folder: str | Path) -> Path:
        """Make the log `folder`/workers.log from here on: what is written so far is appended
        to it (a resumed run's log keeps its earlier runs) and a temporary file is removed.
        Returns the new path."""
        # The run folder exists: this process's own TorchTPU lines (a TPU host's CLI) go there too.
        device_log.move_into(folder)
        target = Path(folder) / WORKERS_LOG
        with self._lock:
            if self._file is None or target == self.path:
                return target
            moved = open(target, "ab", buffering=0)
            start = moved.seek(0, os.SEEK_END)
            with open(self.path, "rb") as written:
                written.seek(self._start)
                shutil.copyfileobj(written, moved)
            self._file.close()
            if self.temporary:
                self.path.unlink(missing_ok=True)
            self._file, self.path, self.temporary, self._start = moved, target, False, start
        return target

    def tail(self, since: int = 0) -> str:
        """The end of what the log wrote after `since` (a `mark`; `TAIL_BYTES` at most), as text."""
        with self._lock:
            try:
                with open(self.path, "rb") as written:
                    end = written.seek(0, os.SEEK_END)
                    written.seek(max(self._start + since, end - TAIL_BYTES, 0))
                    return written.read().decode(errors="replace")
            except OSError:
                return ""

    def failure_note(self, quote: bool = True, since: int = 0) -> str:
        """What a failure message adds: the telling line (with `quote`) of what the workers
        wrote after `since` (a `mark`) and where the log is, e.g. ``"; last output:
        RuntimeError: boom (see workers.log)"``, or "" when they wrote nothing. A temporary log
        is named by its full path and then kept at `close`."""
        text = self.tail(since)
        if not text.strip():
            return ""
        if self.temporary:
            self._keep = True
        where = str(self.path) if self.temporary else self.path.name
        line = telling_line(text) if quote else ""
        return f"; last output: {line} (see {where})" if line else f" (see {where})"

    def drain(self, pump: threading.Thread | None, timeout_s: float = DRAIN_S) -> None:
        """Wait (at most `timeout_s`) for `pump` to copy the rest of its ended child's output."""
        if pump is not None:
            pump.join(timeout_s)

    def close(self) -> None:
        """Stop writing; remove a temporary log that no failure message named (or that is empty)."""
        for pump in self._pumps:
            pump.join(0.2)  # a grandchild may still hold its pipe: its thread is a daemon
        with self._lock:
            if self._file is None:
                return
            self._file.close()
            self._file = None
            if self.temporary:
                if self._keep and self.path.is_file():
                    log.info("the workers' output is in %s", self.path)
                else:
                    self.path.unlink(missing_ok=True)

    def _pump(self, stream: IO[bytes]) -> None:
        fd = stream.fileno()
        try:
            while True:
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    return
                if not data:
                    return
                self.write(data)
        finally:
            stream.close()
