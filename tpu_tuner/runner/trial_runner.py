"""Isolated trial execution: a worker process per start-up environment, a timeout per job.

A job that raises, a worker that dies and a job past its timeout (its worker killed) become a
trial failure of the kind `core.failures.classify` decides; a worker that froze (stopped for
`runner.frozen.FROZEN_GRACE_S`: SIGSTOP) is killed and its trial fails as a HANG, measured again. The study goes on
with a fresh worker. A warm worker is reused across jobs that need the same start-up
environment (TorchTPU eager-mode variables are read once, at process start). The workers'
stdout and stderr go to a `WorkerLog`, not the terminal; a death's message quotes its last line.

Every worker started once the results folder its run shares with other runs is known (`cache_home`,
set before the first worker, or the parent of the run folder the log moved into) and the device
kind too (`device_kind`, set then or by the load job's caller) also gets the backend's variables
for that folder (`Backend.worker_environment`: TorchTPU's compilation cache), which are the same
for every job and so never decide a restart. A job that started its worker says what the start cost
(`JobResult.start_s`: process start to the worker's READY; 0 on a warm worker).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Self

from tpu_tuner.core.failures import FailureKind, describe_end, with_device_cause
from tpu_tuner.execution.measurement import TrialFailure
from tpu_tuner.runner.requests import Request
from tpu_tuner.runner.worker_log import WorkerLog
from tpu_tuner.runner.worker_process import Died, Frozen, Raised, Replied, TimedOut, WorkerProcess

log = logging.getLogger(__name__)

# The trial worker's entry module (`trial_worker.py`).
WORKER_MODULE = "tpu_tuner.runner.trial_worker"


@dataclass
class JobResult:
    """A job's value, or its failure; `seconds` is the wall time seen by the parent."""

    value: Any = None
    failure: TrialFailure | None = None
    seconds: float = 0.0
    # How the worker ended when it died during the job (negative: the signal), else None.
    exit_code: int | None = None
    # What the workers' log adds to a death's or a timeout's message ("; last output: ... (see
    # workers.log)"), already at the end of `failure.message`; "" when it says nothing.
    note: str = ""
    # The hosts whose ranks ran the job, where it spans hosts (runner/multi_host.py).
    hosts: tuple[str, ...] = ()
    # Of `seconds`, the worker's start-up (process start to its READY): 0 on a warm worker; None
    # where it was not told apart (a group of ranks, a worker that died before it was ready).
    start_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


class Runner(Protocol):
    """What every trial runner offers (`TrialRunner`, `RankedTrialRunner`, `MultiHostTrialRunner`):
    the study, the race and the verification take any of them; mypy checks each implements it."""

    @property
    def keeps_warm_steps(self) -> bool:
        """Whether a comparison may run its rounds as several jobs on warm steps (tuning/verify/verification.py)."""

    @property
    def workers_started(self) -> int:
        """Worker processes (or process groups) started so far."""

    log: WorkerLog
    timeout_s: float  # a job's default limit
    device_kind: str | None  # the workers' device kind once known (the load job's caller sets it)
    cache_home: Path | None  # the results folder whose runs share the backend's caches, where known early

    def check_usable(self) -> None:
        """Raise when no job can run here any more (a multi-host runner whose hosts are gone)."""

    def run(self, request: Request, env: dict[str, str] | None = None, timeout_s: float | None = None) -> JobResult:
        """Run one job; a failure is in the result, never raised."""

    def close(self) -> None:
        """Stop the runner's workers."""

    def __enter__(self) -> Runner:
        """The runner, closed when the `with` block ends."""

    def __exit__(self, *exc_info: object) -> None:
        """Close the runner."""


class TrialRunner:
    """Runs jobs in isolated worker processes; a failure never takes the caller down.

    The workers' output goes to `log` (None: a temporary log of the runner's own, removed at
    `close` unless a failure message named it); the caller may move it into its run folder
    (`runner.log.move_into(run_dir)`) and owns a log it passed in."""

    # A worker stays warm between jobs, so a comparison may run its rounds as several jobs
    # (tuning/verify/verification.py), the steps built by the first kept for the rest.
    keeps_warm_steps = True

    def __init__(
        self,
        workload_path: str,
        device: str | None = None,
        timeout_s: float = 300.0,
        memory_limit_bytes: int | None = None,
        log: WorkerLog | None = None,
    ) -> None:
        self.workload_path = str(workload_path)
        self.device = device
        self.timeout_s = timeout_s
        self.memory_limit_bytes = memory_limit_bytes
        self._worker: WorkerProcess | None = None
        self._env: dict[str, str] = {}
        self.workers_started = 0
        self.device_kind: str | None = None
        # The results folder whose runs share the backend's caches, where the caller knows it
        # before the first worker starts (None: the run folder's parent, once the log is there).
        self.cache_home: Path | None = None
        self._owns_log = log is None
        self.log = log if log is not None else WorkerLog()

    def check_usable(self) -> None:
        """Every job can run here (a runner over several hosts raises once they are lost for good)."""

    def run(self, request: Request, env: dict[str, str] | None = None, timeout_s: float | None = None) -> JobResult:
        """Run one job; start (or restart) a worker when none is alive or the environment differs."""
        env = env or {}
        start = time.perf_counter()
        self.log.reopen()  # after `close`, which closed a log of its own
        since = self.log.mark()  # a failure quotes only this job's output (and its worker's start-up)
        warm = not (self._worker is None or not self._worker.alive() or env != self._env)
        if not warm:
            self._start(env)
        worker = self._worker
        assert worker is not None
        limit = timeout_s or self.timeout_s
        outcome = worker.request(request, limit)
        seconds = time.perf_counter() - start
        start_s = 0.0 if warm else worker.ready_s
        match outcome:
            case Replied(value):
                return JobResult(value=value, seconds=seconds, start_s=start_s)
            case Raised(kind, message, trace):
                # The device's own log may name the cause Python did not (an out-of-memory).
                kind, message = with_device_cause(kind, message, self.log.tail(since))
                # The report keeps the first line; the traceback goes where the workers' output is.
                self.log.write(f"tpu-tune: the job failed in the worker ({kind.value}):\n{trace}\n".encode())
                if kind is FailureKind.OOM:
                    self.stop_worker()  # a device that ran out may be left unusable: the next job starts afresh
                return JobResult(failure=TrialFailure(kind, message), seconds=seconds, start_s=start_s)
        self._worker = None  # killed (a timeout, a freeze) or dead: the next job starts another
        # A killed worker's last line is whatever ran, not a cause: only a death's is quoted.
        note = self.log.failure_note(quote=isinstance(outcome, Died), since=since)
        match outcome:
            case TimedOut():
                failure = TrialFailure(FailureKind.TIMEOUT, f"no result after {limit:.0f} s; worker killed{note}")
                return JobResult(failure=failure, seconds=seconds, note=note)
            case Frozen() as frozen:
                return JobResult(failure=TrialFailure(FailureKind.HANG, frozen.describe() + note), seconds=seconds)
            case Died() as died:
                failure = TrialFailure(died.kind, f"worker {describe_end(died.exit_code)}{note}")
                return JobResult(failure=failure, seconds=seconds, exit_code=died.exit_code, note=note)
        raise AssertionError(f"unknown outcome {outcome!r}")

    def close(self) -> None:
        """Stop the worker; close the log when it is the runner's own."""
        self.stop_worker()
        if self._owns_log:
            self.log.close()

    def stop_worker(self) -> None:
        """Stop the worker (politely, then by force); the next job starts another."""
        if self._worker is not None:
            self._worker.close()
        self._worker = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def run_environment(self) -> dict[str, str]:
        """The variables every worker of this run gets, whatever its job: the backend's for the
        results folder its runs share (`Backend.worker_environment`), once that folder and the
        device kind are known; empty before, and on backends that need none."""
        home = self.cache_home
        if home is None and not self.log.temporary:
            home = Path(self.log.path).parent.parent  # the log is in the run folder
        if self.device_kind is None or home is None:
            return {}
        from tpu_tuner.devices import backend_class

        return backend_class(self.device_kind).worker_environment(home)

    def _start(self, env: dict[str, str]) -> None:
        """Start a worker (`python -m tpu_tuner.runner.trial_worker`); start-up environment
        variables go into the child's environment only. The run's own variables
        (`run_environment`) come first: a job's start-up variables are the ones that differ."""
        if self._worker is not None:
            self._worker.close(kill=True)
        self._worker = WorkerProcess(
            WORKER_MODULE,
            [self.workload_path, self.device or "auto", str(self.memory_limit_bytes or 0)],
            {**self.run_environment(), **env},
            output=self.log,
        )
        self._env = dict(env)
        self.workers_started += 1
