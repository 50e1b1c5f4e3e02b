"""One subprocess worker: a fresh ``python -m MODULE`` on two pipes, and the loop it serves.

Trial workers (`trial_runner.py`, `trial_worker.py`) and the planner's compile workers
(`planner/compiler/compile_pool.py`) both run on this. The parent starts the child with the environment it
needs, sends it a job (any picklable object), reads the reply with a timeout and, when the child
dies, decodes its exit status; the child runs `serve`, which answers each job with
``("ok", value)`` or ``(kind, message, traceback)`` until it is sent None. A child served with
`ready` first says ``READY`` once its start-up is done, so the parent measures what starting it
cost (`WorkerProcess.ready_s`) apart from its first job.

A plain subprocess rather than multiprocessing's spawn: spawn re-imports the caller's main
module, which breaks scripts that call the API without a ``__main__`` guard. The child is a fresh
interpreter (not a fork: libtpu, JAX and torch hold threads). It leads a process group of its own,
so that a child killed (a timeout, a freeze, the run's clock) is killed with whatever it started
(compiler processes, a library's helpers), and it dies with its parent (`serve`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from tpu_tuner.core.failures import FailureKind, classify, failure_line
from tpu_tuner.runner.frozen import LOOK_S, Frozen, FrozenWatch
from tpu_tuner.runner.parent_death import die_with_parent

if TYPE_CHECKING:  # the log is handed in; this module never makes one
    from tpu_tuner.runner.worker_log import WorkerLog


# The child's exit status is read this long after its pipe closed before it is killed.
EXIT_WAIT_S = 10.0
# What a child served with `ready` sends once its start-up is done, before any reply.
READY = ("ready",)
# The parent's pid, in the child's environment: the child dies with that process (`serve`).
PARENT_VARIABLE = "TPU_TUNE_WORKER_PARENT"


@dataclass(frozen=True)
class Replied:
    """The job's value."""

    value: Any


@dataclass(frozen=True)
class Raised:
    """The job raised in the child: a failure kind (`failure_of`'s, or one the child's `describe`
    chose), its first line and the traceback."""

    kind: FailureKind
    message: str
    traceback: str = ""


@dataclass(frozen=True)
class Died:
    """The child ended during the job: its exit status (negative: the signal; None: it did not
    exit within `EXIT_WAIT_S` of its pipe closing, and was killed)."""

    exit_code: int | None

    @property
    def kind(self) -> FailureKind:
        """The failure kind a death reads as (`core.failures.classify`: SIGKILL is out of memory)."""
        return classify(self.exit_code, died=True)


@dataclass(frozen=True)
class TimedOut:
    """No reply within `seconds`; the child was killed."""

    seconds: float


Outcome = Replied | Raised | Died | TimedOut | Frozen


class WorkerProcess:
    """A child ``python -m MODULE READ_FD WRITE_FD ARGS...`` with the parent's environment plus
    `child_environment()` and `env`; its stdout and stderr (file descriptors 1 and 2, so what C
    code prints too) go to `output` (None: the parent's terminal)."""

    def __init__(
        self,
        module: str,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        output: WorkerLog | None = None,
    ) -> None:
        from tpu_tuner.core.tpu_host import child_environment

        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        # One pipe for both streams: the log keeps their lines in the order the child wrote them;
        # unbuffered, so a child that dies leaves its Python prints in the log too.
        streams: dict[str, Any] = {}
        if output is not None:
            streams = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
            env = {"PYTHONUNBUFFERED": "1", **(env or {})}
        self.started = time.perf_counter()
        # Seconds from the start to the child's READY (None: not yet, or it never says so).
        self.ready_s: float | None = None
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, str(to_child_r), str(from_child_w), *args],
            pass_fds=(to_child_r, from_child_w),
            env={**os.environ, **child_environment(), **(env or {}), PARENT_VARIABLE: str(os.getpid())},
            start_new_session=True,  # a group of its own: killed whole (`close`)
            **streams,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self.output = output
        self._pump = output.capture(self.process.stdout) if output is not None and self.process.stdout else None
        self._send = Connection(to_child_w, readable=False)
        # The reply end: `multiprocessing.connection.wait` takes it to serve several workers at once.
        self.connection = Connection(from_child_r, writable=False)

    def alive(self) -> bool:
        """Whether the child is still running."""
        return self.process.poll() is None

    def send(self, job: Any) -> bool:
        """Send a job; False when the pipe is broken (the child died)."""
        try:
            self._send.send(job)
        except (BrokenPipeError, OSError):
            return False
        return True

    def receive(self, timeout_s: float | None = None) -> Outcome:
        """The reply to the job sent, waiting at most `timeout_s` (None: until it comes or the
        child dies); past the timeout, or once the child is stopped for `frozen.FROZEN_GRACE_S`
        (SIGSTOP: `Frozen`), the child is killed. A READY on the way is noted (`ready_s`) and
        the wait goes on, under the same deadline: the start-up is part of the first job's time."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        watch = FrozenWatch()
        while True:
            while not self.connection.poll(
                LOOK_S if deadline is None else max(0.0, min(LOOK_S, deadline - time.monotonic()))
            ):
                if (frozen := watch.look([(self.process.pid, "the worker")])) is not None:
                    self.close(kill=True)
                    return frozen
                if deadline is not None and time.monotonic() >= deadline:
                    self.close(kill=True)
                    return TimedOut(float(timeout_s or 0.0))
            try:
                reply = self.connection.recv()
            except (EOFError, OSError):
                return self.died()
            if reply[0] != READY[0]:
                break
            self.ready_s = time.perf_counter() - self.started
        if reply[0] == "ok":
            return Replied(reply[1])
        return Raised(*reply)

    def request(self, job: Any, timeout_s: float | None = None) -> Outcome:
        """Send `job` and read its reply (`receive`)."""
        return self.receive(timeout_s) if self.send(job) else self.died()

    def died(self) -> Died:
        """How the child ended (its pipe closed): its exit status, the child then cleaned up."""
        try:
            code: int | None = self.process.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            code = None
        self.close(kill=True)
        if self.output is not None:  # its last words reach the log before a message quotes it
            self.output.drain(self._pump)
        return Died(code)

    def close(self, kill: bool = False, grace_s: float = 5.0) -> None:
        """End the child: ask it to exit and wait `grace_s`, then kill it; with `kill`, at once."""
        if not kill and self.alive():
            try:
                self._send.send(None)
                self.process.wait(grace_s)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                pass
        if self.alive():
            self.process.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)  # what it started, in its group, too
        self.process.wait(EXIT_WAIT_S)
        self._send.close()
        self.connection.close()


def failure_of(exc: BaseException) -> tuple[FailureKind, str]:
    """An exception as a failure kind (`core.failures.classify`: out of memory or an error) and
    its first line, with the cause a wrapper's line announces (`core.failures.failure_line`)."""
    return classify(message=f"{type(exc).__name__}: {exc}".strip()), failure_line(exc)


def serve(
    read_fd: int,
    write_fd: int,
    handle: Callable[[Any], Any],
    describe: Callable[[BaseException, Any], tuple[FailureKind, str]] | None = None,
    catch: type[BaseException] = BaseException,
    ready: Callable[[], None] | None = None,
) -> None:
    """The child's loop: answer each job with ``("ok", handle(job))``, or, when it raises one of
    `catch`, with ``(kind, message, traceback)`` from `describe(exc, job)` (default: `failure_of`),
    until the parent sends None or closes its end. An exception outside `catch` ends the child.
    With `ready`, the child first runs it (its start-up: it must not raise) and sends READY."""
    die_with_parent(PARENT_VARIABLE)
    receive = Connection(read_fd, writable=False)
    send = Connection(write_fd, readable=False)
    if ready is not None:
        ready()
        send.send(READY)
    while True:
        try:
            job = receive.recv()
        except EOFError:
            return
        if job is None:
            return
        try:
            reply: tuple[Any, ...] = ("ok", handle(job))
        except catch as exc:
            kind, message = describe(exc, job) if describe is not None else failure_of(exc)
            reply = (kind, message, traceback.format_exc()[-4000:])
        send.send(reply)
