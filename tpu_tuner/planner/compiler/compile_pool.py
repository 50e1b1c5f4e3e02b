"""Compile the planner's programs in worker processes, several at once.

Why processes: one TPU compile keeps about one core busy (docs/planner.md, "Compiling many
layouts"), so two workers on two cores halve a plan's wall time; a libtpu abort or a runaway compile
ends one worker, not the plan; and torchax, which breaks torch.compile in any process that imports
it, stays out of the caller's process. Workers are fresh interpreters on the subprocess-worker
primitive (`runner/worker_process.py`, as trial workers are) that live for the whole plan, so
each pays the JAX / torchax / libtpu start-up once.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from functools import lru_cache
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from tpu_tuner.core.errors import first_line
from tpu_tuner.core.failures import describe_end
from tpu_tuner.planner.compiler.compile_request import CompileJob
from tpu_tuner.planner.compiler.compiled_step import CompiledStep
from tpu_tuner.planner.compiler.pool_defaults import COMPILE_TIMEOUT_S
from tpu_tuner.planner.compiler.program import compile_step
from tpu_tuner.runner.worker_log import WorkerLog
from tpu_tuner.runner.worker_process import Died, Replied, WorkerProcess, serve

# The compile worker's entry module: this one (`_serve`).
WORKER_MODULE = "tpu_tuner.planner.compiler.compile_pool"
# An idle compile worker asked to exit is waited for this long before it is killed.
EXIT_GRACE_S = 10.0

log = logging.getLogger(__name__)
Finish = Callable[[CompileJob, CompiledStep], None]  # told each job's outcome as it comes


def run_job(job: CompileJob) -> CompiledStep:
    """Compile `job` in this process (the workers' entry point)."""
    workload = planned_source(job.model.source)
    return compile_step(job, lambda: workload.model_for_preset(job.model.preset), job.target.devices())


def compiler_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a compiler process gets besides the parent's environment: JAX's CPU platform alone
    (where the user set none). Compile-only topologies need no chip, and on a TPU host a process
    that initializes JAX's TPU platform opens the chip, which one process at a time may hold: with
    a training run on it, or two compiler processes, every compile failed "TPU initialization
    failed: open(/dev/vfio/N): Device or resource busy" (v5e host, 2026-12-06)."""
    environ = os.environ if environ is None else environ
    return {} if "JAX_PLATFORMS" in environ else {"JAX_PLATFORMS": "cpu"}


class CompilePool:
    """Compiler processes, started as soon as the pool is made so that their start-up (JAX,
    torchax, libtpu: a few seconds each) overlaps the caller's own work; use it as a context
    manager so they always end."""

    def __init__(self, workers: int, log_path: str | Path | None = None, timeout_s: float = COMPILE_TIMEOUT_S) -> None:
        """`log_path`: a file that takes the workers' stdout and stderr (libtpu's start-up
        complaints about TPU_WORKER_HOSTNAMES, compiler stack dumps); None leaves them on the
        caller's terminal. The caller still hears of every event, as one log line each.
        `timeout_s`: a job still compiling after this long has its worker killed and fails."""
        self.timeout_s = timeout_s
        # Compile-only use never touches a TPU; without this every worker after the first waits on
        # libtpu's exclusive /tmp/libtpu_lockfile.
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        self.workers = max(1, workers)
        self.log_path = Path(log_path) if log_path is not None else None
        # Every worker's output appended as it comes (runner/worker_log.py, as trial workers'), so
        # a worker that dies leaves everything it wrote.
        self._log = WorkerLog(self.log_path) if self.log_path is not None else None
        self._idle: list[WorkerProcess] = [self._start() for _ in range(self.workers)]

    def __enter__(self) -> CompilePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> WorkerProcess:
        """A compiler process (`python -m tpu_tuner.planner.compiler.compile_pool`), its output to the log."""
        return WorkerProcess(WORKER_MODULE, output=self._log, env=compiler_environment())

    def close(self) -> None:
        """End every idle worker and close the log."""
        # An idle worker holds nothing: it is killed, not asked to exit (an interpreter holding
        # libtpu takes over a second to exit cleanly).
        for worker in self._idle:
            worker.close(kill=True)
        self._idle = []
        if self._log is not None:
            self._log.close()
            self._log = None

    def compile(self, jobs: Iterable[CompileJob], done: Finish | None = None) -> dict[CompileJob, CompiledStep]:
        """Compile every job, each worker on its own pipe, so a worker that dies (a libtpu abort,
        the kernel's OOM killer) costs exactly its own job, which gets a CompiledStep with the
        reason; a fresh worker takes the next job."""
        queue = list(jobs)
        results: dict[CompileJob, CompiledStep] = {}
        busy: dict[Any, tuple[WorkerProcess, CompileJob]] = {}  # connection -> (worker, job)
        deadlines: dict[Any, float] = {}  # connection -> when its job is taken as hung

        def finish(job: CompileJob, step: CompiledStep) -> None:
            results[job] = step
            if done:
                done(job, step)

        try:
            while queue or busy:
                while queue and len(busy) < self.workers:
                    worker = self._idle.pop() if self._idle else self._start()
                    job = queue.pop(0)
                    worker.send(job)  # a worker that died already answers with its death below
                    busy[worker.connection] = (worker, job)
                    deadlines[worker.connection] = time.monotonic() + self.timeout_s
                # A dead worker's pipe is ready too (at end of file); a hung one is never ready.
                ready = set(wait(list(busy), timeout=max(0.0, min(deadlines.values()) - time.monotonic())))
                for connection, (worker, job) in list(busy.items()):
                    if connection not in ready:
                        if time.monotonic() >= deadlines[connection]:
                            del busy[connection], deadlines[connection]
                            self._hung(worker, job, finish)
                        continue
                    del busy[connection], deadlines[connection]
                    outcome = worker.receive()  # ready: the reply, or the end of a dead worker's pipe
                    if isinstance(outcome, Replied):
                        finish(job, outcome.value)
                        self._idle.append(worker)
                        continue
                    reason = _death(outcome) if isinstance(outcome, Died) else f"sent an unexpected reply {outcome}"
                    where = f" (its output is in {self.log_path})" if self.log_path is not None else ""
                    _failed(job, reason, finish, 0.0, where)
                    worker.close(grace_s=EXIT_GRACE_S)
        finally:
            for worker, _ in busy.values():  # only after an exception: their jobs are abandoned
                worker.close(kill=True)
        return results

    def _hung(self, worker: WorkerProcess, job: CompileJob, finish: Finish) -> None:
        """A job past the timeout: its worker killed (a fresh one takes the next job), the job failed."""
        worker.close(kill=True)
        reason = f"was still compiling after {self.timeout_s:g} s (--compile-timeout) and was killed"
        _failed(job, reason, finish, self.timeout_s)


def _failed(job: CompileJob, reason: str, finish: Finish, seconds: float, where: str = "") -> None:
    """A job its compiler process ended without compiling: said in a log line, finished with the reason."""
    log.warning("compile worker for %s (%d blocks) %s%s", job.point.layout.name(), job.model.blocks, reason, where)
    finish(job, CompiledStep(0, 0, 0, 0, 0, 0, [], seconds, error=f"the compiler process {reason}"))


@contextmanager
def stderr_to(path: str | Path | None) -> Iterator[None]:
    """Send this process's file descriptor 2 to `path` (appended) for the block: libtpu writes its
    logs from C, past Python's sys.stderr. None changes nothing."""
    if path is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(path, "ab", buffering=0) as target:
            os.dup2(target.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _serve(read_fd: int, write_fd: int) -> None:
    """The worker's loop: compile each job it is sent until it is sent None."""
    with suppress(Exception):  # import the compile path's libraries while the caller still prepares its first job
        import jax  # noqa: F401

        from tpu_tuner.planner.compiler.torchax_compat import import_torchax

        import_torchax()
    # Only Exception is caught: anything else (an interrupt) ends the worker, which reads as its death.
    serve(read_fd, write_fd, compile_or_fail, catch=Exception)


def compile_or_fail(job: CompileJob) -> CompiledStep:
    """`run_job`, an exception in it returned as the step's error (what a compile worker sends back)."""
    try:
        return run_job(job)
    except Exception as exc:
        return CompiledStep(0, 0, 0, 0, 0, 0, [], 0.0, error=first_line(exc))


def _death(died: Died) -> str:
    """How a compile worker ended (`core.failures.describe_end`), and libtpu's part where a signal says it."""
    said = {
        -signal.SIGFPE: "inside libtpu: a compiler bug",
        -signal.SIGSEGV: "inside libtpu",
        -signal.SIGABRT: "libtpu aborted",
    }.get(died.exit_code or 0)
    return describe_end(died.exit_code) + (f" ({said})" if said else "")


@lru_cache(maxsize=4)
def planned_source(model_file: str) -> Any:
    """The workload of a plan's model source, loaded once a worker (a few sources a plan at most)."""
    from tpu_tuner.planner.plans.hf_plan import planned_workload

    return planned_workload(model_file)  # an hf: source takes the route the plan's process took


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
