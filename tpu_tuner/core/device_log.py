"""What TorchTPU and libtpu write in the `tpu-tune` process itself, kept in the run folder's
device.log rather than on the user's terminal (docs/torchtpu.md, "A quiet terminal").

On a TPU host every ``import torch`` autoloads torch-tpu, and its start-up writes three ways
(torch-tpu 0.2.0's sources): libtpu's and TorchTPU's C++ runtime log through absl to file
descriptor 2 ("WARNING: All log messages before absl::InitializeLog() ...", ``I0000 ...
pjrt_api.cc:119] GetPjrtApi was found ...``); ``torch_tpu/_loader.py`` prints to ``sys.stderr``
("Successfully renamed PrivateUse1 backend to 'tpu'", "Initializing TPU distributed runtime");
and Python warnings tagged ``<TorchTpu/...>`` (tcmalloc not loaded, an experimental API). So the
capture works at both levels: file descriptors 1 and 2 go to a file, and ``sys.stdout`` /
``sys.stderr`` become the terminal again (dups of the original descriptors), except for what is
written from inside TorchTPU's or libtpu's Python code, or is a warning of TorchTPU's, which
follows the descriptors into the file. tpu-tune's own lines, tracebacks and one-line errors reach
the terminal as before.

The file is a temporary one until the run folder exists, then the folder's device.log
(`move_into`, called as the workers' log moves there): what it holds so far is appended, and the
descriptors write on into device.log until the process ends, so the runtime's later lines (a
client created, torn down) land there too. `finish` says what became of a temporary file when
the command ends without a folder: kept, and its path returned, when the command failed (its
lines may say why); removed otherwise.

Only the CLI starts it (`start`), and only on a host whose ``import torch`` loads torch-tpu: the
Python API leaves its caller's streams alone, and a CPU or GPU host is untouched.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from tpu_tuner.core.run_folder import DEVICE_LOG

log = logging.getLogger(__name__)

# The modules whose Python-level writes are the device runtime's: torch-tpu's package (``torch.tpu``
# is its public face) and libtpu's Python wrapper.
DEVICE_MODULES = ("torch_tpu", "torch.tpu", "libtpu")
# The prefix of every TorchTPU warning's message (``torch_tpu._internal.warnings.format_message``),
# also of those its C++ raises through torch's warning handler, with no TorchTPU frame on the stack.
WARNING_TAG = "<TorchTpu/"


def _device_module(name: object) -> bool:
    return isinstance(name, str) and any(name == m or name.startswith(m + ".") for m in DEVICE_MODULES)


def written_by_device_runtime(text: str, depth: int = 2) -> bool:
    """Whether `text`, being written to ``sys.stdout`` / ``sys.stderr`` by the frame `depth` up
    from here, comes from TorchTPU or libtpu: a TorchTPU module is on the writer's stack (its
    prints and logging, a warning it issues), or the ``warnings`` module writes one of its tagged
    warnings. Only a warning is read for the tag: a tpu-tune message that quotes one stays."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(depth - 1):  # none left where the interpreter itself writes (an uncaught exception)
        frame = frame.f_back if frame is not None else None
    if frame is not None and frame.f_globals.get("__name__") == "warnings" and WARNING_TAG in text:
        return True
    while frame is not None:
        if _device_module(frame.f_globals.get("__name__")):
            return True
        frame = frame.f_back
    return False


class _Routed:
    """``sys.stdout`` or ``sys.stderr`` while the device output is captured: the terminal, but
    what the device runtime writes goes to descriptor `fd` (the capture file)."""

    def __init__(self, terminal: TextIO, fd: int) -> None:
        self.terminal = terminal
        self.fd = fd

    def write(self, text: str) -> int:
        if not written_by_device_runtime(text):
            return self.terminal.write(text)
        data = text.encode(getattr(self.terminal, "encoding", None) or "utf-8", "backslashreplace")
        while data:  # unbuffered, as the runtime's own C writes are: a crash loses none of it
            data = data[os.write(self.fd, data) :]
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.terminal.flush()

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, buffer: the terminal's
        return getattr(self.terminal, name)


def _terminal(stream: TextIO, fd: int, saved: int) -> TextIO:
    """A text stream on `saved` (a dup of `fd`, the terminal) like `stream`, where `stream` writes
    to `fd`; else `stream` itself (a test's capture, a stream on another file)."""
    try:
        writes_to_fd = stream.fileno() == fd
    except (AttributeError, OSError, ValueError):
        writes_to_fd = False
    if not writes_to_fd:
        return stream
    # Buffered as `stream` is (python -u and PYTHONUNBUFFERED give a raw file); lives as long as the process.
    unbuffered = isinstance(getattr(stream, "buffer", None), io.RawIOBase)
    raw = open(saved, "wb", buffering=0 if unbuffered else -1, closefd=False)
    return io.TextIOWrapper(
        raw,
        encoding=stream.encoding,
        errors=stream.errors,
        line_buffering=bool(stream.line_buffering),
        write_through=getattr(stream, "write_through", False),
    )


def _append_fd(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def _copy(source: Path, target_fd: int, offset: int) -> int:
    """Append `source`'s bytes from `offset` to `target_fd`; the offset after them."""
    with open(source, "rb") as read:
        read.seek(offset)
        while chunk := read.read(1 << 20):
            while chunk:
                chunk = chunk[os.write(target_fd, chunk) :]
        return read.tell()


class DeviceLog:
    """File descriptors 1 and 2 of this process in a file (module doc); one per process (`start`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.path = Path()
        self.temporary = True
        self._keep = False  # a move failed: the temporary file is all there is
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = (os.dup(1), os.dup(2))  # the terminal
        self._point_at_temporary()
        sys.stdout = _Routed(_terminal(sys.stdout, 1, self._saved[0]), 1)
        sys.stderr = _Routed(_terminal(sys.stderr, 2, self._saved[1]), 2)

    def _point_at_temporary(self) -> None:
        fd, name = tempfile.mkstemp(prefix="tpu-tune-device-", suffix=".log")
        os.close(fd)
        self._point_at(Path(name))
        self.path, self.temporary, self._keep = Path(name), True, False

    @staticmethod
    def _point_at(path: Path) -> None:
        # O_APPEND: descriptors 1 and 2 share the file with whatever else appends to it.
        fd = _append_fd(path)
        try:
            os.dup2(fd, 1)
            os.dup2(fd, 2)
        finally:
            os.close(fd)

    def restart(self) -> None:
        """Begin again in a new temporary file (a second command in one process)."""
        with self._lock:
            self._point_at_temporary()

    def move_into(self, folder: str | Path) -> Path:
        """Make `folder`/device.log the file from here on: a temporary file's lines are appended
        to it (a resumed run's log keeps its earlier runs) and the temporary file is removed. A
        write that fails (a full disk) leaves everything in the temporary file, kept."""
        target = Path(folder) / DEVICE_LOG
        with self._lock:
            if target == self.path:
                return target
            try:
                fd = _append_fd(target)
                try:
                    copied = _copy(self.path, fd, 0) if self.temporary else 0
                    os.dup2(fd, 1)
                    os.dup2(fd, 2)
                    if self.temporary:  # what was written between the copy and the switch
                        _copy(self.path, fd, copied)
                finally:
                    os.close(fd)
            except OSError as exc:
                log.warning("TorchTPU's output stays in %s: %s could not be written (%s)", self.path, target, exc)
                self._keep = self.temporary
                return self.path
            if self.temporary:
                self.path.unlink(missing_ok=True)
            self.path, self.temporary = target, False
        return target

    def finish(self, keep: bool) -> Path | None:
        """The command ended: a temporary file (no run folder was made) is kept and returned where
        `keep` (the command failed) and it holds anything, else removed; None otherwise."""
        with self._lock:
            if not self.temporary:
                return None
            try:
                empty = self.path.stat().st_size == 0
            except OSError:
                return None
            if (keep or self._keep) and not empty:
                return self.path
            self.path.unlink(missing_ok=True)
            return None


_current: DeviceLog | None = None


def start() -> DeviceLog:
    """Capture this process's device output in a new temporary file (module doc); the CLI calls
    it before anything imports torch."""
    global _current
    if _current is None:
        _current = DeviceLog()
    else:
        _current.restart()
    return _current


def current() -> DeviceLog | None:
    """The capture `start` began in this process, if any."""
    return _current


def move_into(folder: str | Path) -> Path | None:
    """Where a capture is running, make `folder`/device.log its file (`DeviceLog.move_into`);
    else nothing. Called when a run's folder is made."""
    return _current.move_into(folder) if _current is not None else None


__all__ = ["DEVICE_MODULES", "WARNING_TAG", "DeviceLog", "current", "move_into", "start", "written_by_device_runtime"]
