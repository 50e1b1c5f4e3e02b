"""Isolated trial execution: a worker process per environment, a timeout per job.

A job that raises becomes an "error" (or "oom" for allocation failures); a worker that dies is a
"crash" (a signal such as SIGSEGV) or "oom" (SIGKILL, which is how the kernel's OOM killer
ends a process); a job past its timeout is killed and becomes a "timeout". The study goes on
with a fresh worker. A warm worker is reused across jobs that need the same start-up
environment (TorchTPU eager-mode variables are read once, at process start).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from tpu_tuner.execution.measurement import TrialFailure

log = logging.getLogger(__name__)


@dataclass
class JobResult:
    """A job's value, or its failure; `seconds` is the wall time seen by the parent."""

    value: Any = None
    failure: TrialFailure | None = None
    seconds: float = 0.0
    # How the worker ended when it died during the job (negative: the signal), else None.
    exit_code: int | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


class TrialRunner:
    """Runs jobs in isolated worker processes; a failure never takes the caller down."""

    # A worker stays warm between jobs, so a comparison may run its rounds as several jobs
    # (tuning/verify.py), the steps built by the first kept for the rest.
    keeps_warm_steps = True

    def __init__(
        self,
        workload_path: str,
        device: str | None = None,
        timeout_s: float = 300.0,
        memory_limit_bytes: int | None = None,
    ) -> None:
        self.workload_path = str(workload_path)
        self.device = device
        self.timeout_s = timeout_s
        self.memory_limit_bytes = memory_limit_bytes
        self._process: subprocess.Popen[bytes] | None = None
        self._send: Connection | None = None
        self._recv: Connection | None = None
        self._env: dict[str, str] = {}
        self.workers_started = 0

    def run(self, job: str, payload: Any, options: dict[str, Any], env: dict[str, str] | None = None,
            timeout_s: float | None = None) -> JobResult:
        """Run one job; start (or restart) a worker when none is alive or the environment differs."""
        env = env or {}
        start = time.perf_counter()
        if self._process is None or self._process.poll() is not None or env != self._env:
            self._start(env)
        assert self._send is not None and self._recv is not None
        try:
            self._send.send((job, payload, options))
        except (BrokenPipeError, OSError):
            return self._died(start)
        limit = timeout_s or self.timeout_s
        if not self._recv.poll(limit):
            self._kill()
            return JobResult(failure=TrialFailure("timeout", f"no result after {limit:.0f} s; worker killed"),
                             seconds=time.perf_counter() - start)
        try:
            reply = self._recv.recv()
        except (EOFError, OSError):
            return self._died(start)
        seconds = time.perf_counter() - start
        if reply[0] == "ok":
            return JobResult(value=reply[1], seconds=seconds)
        log.debug("worker job failed: %s", reply[2])
        return JobResult(failure=TrialFailure(reply[0], reply[1]), seconds=seconds)

    def close(self) -> None:
        """Stop the worker (politely, then by force)."""
        if self._process is not None and self._process.poll() is None and self._send is not None:
            try:
                self._send.send(None)
                self._process.wait(5)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                pass
        self._kill()

    def __enter__(self) -> "TrialRunner":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _start(self, env: dict[str, str]) -> None:
        """Start a worker: a fresh interpreter (`python -m tpu_tuner.runner.worker`) on two pipes.

        A plain subprocess rather than multiprocessing's spawn: spawn re-imports the caller's
        main module, which breaks scripts that call the API without a __main__ guard.
        Start-up environment variables go into the child's environment only.
        """
        self._kill()
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        command = [
            sys.executable, "-m", "tpu_tuner.runner.worker", str(to_child_r), str(from_child_w),
            self.workload_path, self.device or "auto", str(self.memory_limit_bytes or 0),
        ]
        from tpu_tuner.core.tpu_host import child_environment

        self._process = subprocess.Popen(command, pass_fds=(to_child_r, from_child_w),
                                         env={**os.environ, **child_environment(), **env})
        os.close(to_child_r)
        os.close(from_child_w)
        self._send = Connection(to_child_w, readable=False)
        self._recv = Connection(from_child_r, writable=False)
        self._env = dict(env)
        self.workers_started += 1

    def _kill(self) -> None:
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            self._process.wait(10)
        for conn in (self._send, self._recv):
            if conn is not None:
                conn.close()
        self._process, self._send, self._recv = None, None, None

    def _died(self, start: float) -> JobResult:
        assert self._process is not None
        try:
            code = self._process.wait(10)
        except subprocess.TimeoutExpired:
            code = None
        self._kill()
        seconds = time.perf_counter() - start
        if code == -signal.SIGKILL:
            return JobResult(failure=TrialFailure("oom", "worker killed by SIGKILL (the kernel's OOM killer)"), seconds=seconds,
                             exit_code=code)
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            return JobResult(failure=TrialFailure("crash", f"worker died from {name}"), seconds=seconds, exit_code=code)
        return JobResult(failure=TrialFailure("crash", f"worker exited with status {code}"), seconds=seconds,
                         exit_code=code)
