"""Compile the planner's programs in worker processes, several at once.

Why processes: one TPU compile keeps about one core busy (measured: 29 s of CPU in 26 s of wall
time), so two workers on two cores halve a plan's wall time; a libtpu abort or a runaway compile
ends one worker, not the plan; and torchax, which breaks torch.compile in any process that imports
it, stays out of the caller's process. Workers are fresh interpreters (not forks: libtpu and JAX
hold threads) that live for the whole plan, so each pays the JAX / torchax / libtpu start-up once.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import IO, Any

from tpu_tuner.model.layouts import Layout
from tpu_tuner.planner.program import CompiledStep, compile_step
from tpu_tuner.core.tpu_host import child_environment

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompileJob:
    """One program to compile: the model cut to `blocks` repeated blocks (scanned or unrolled), on one layout."""

    model_file: str
    preset: str | None
    blocks: int
    layout: Layout
    topology: str  # the name get_topology_desc takes, e.g. "v5p:16x16x32"
    global_batch: int
    seq_len: int
    d_model: int
    remat: str
    fast: bool
    scan: bool = False
    accumulation: int = 1  # micro-batches a step
    first_moment_dtype: str = "float32"  # AdamW's first moment (MaxText's mu_dtype)
    compiler_options: tuple[tuple[str, Any], ...] = ()  # added to the TPU compile's options


def default_workers() -> int:
    """One worker per core, at most 4 (each 70B compile holds a few GiB of host memory)."""
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def run_job(job: CompileJob) -> CompiledStep:
    """Compile `job` in this process (the workers' entry point)."""
    workload = _workload(job.model_file)
    return compile_step(lambda: workload.model_for_preset(job.preset), job.blocks, job.layout,
                        topology_devices(job.topology), job.global_batch, job.seq_len, job.d_model,
                        remat=job.remat, fast=job.fast, scan=job.scan, accumulation=job.accumulation,
                        first_moment_dtype=job.first_moment_dtype, compiler_options=job.compiler_options)


class CompilePool:
    """Compiler processes, started as soon as the pool is made so that their start-up (JAX,
    torchax, libtpu: a few seconds each) overlaps the caller's own work; use it as a context
    manager so they always end."""

    def __init__(self, workers: int, log_path: str | Path | None = None) -> None:
        """`log_path`: a file that takes the workers' stdout and stderr (libtpu's start-up
        complaints about TPU_WORKER_HOSTNAMES, compiler stack dumps); None leaves them on the
        caller's terminal. The caller still hears of every event, as one log line each."""
        # Compile-only use never touches a TPU; without this every worker after the first waits on
        # libtpu's exclusive /tmp/libtpu_lockfile.
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        self.workers = max(1, workers)
        self.log_path = Path(log_path) if log_path is not None else None
        # Appended to by every worker (each holds its own descriptor); unbuffered, so a worker that
        # dies leaves everything it wrote.
        self._log = open(self.log_path, "ab", buffering=0) if self.log_path is not None else None  # noqa: SIM115
        self._idle: list[_Worker] = [_Worker(self._log) for _ in range(self.workers)]

    def __enter__(self) -> CompilePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        # An idle worker holds nothing: it is killed, not asked to exit (an interpreter holding
        # libtpu takes over a second to exit cleanly; measured 2.4 s for two, one after the other).
        for worker in self._idle:
            worker.close(kill=True)
        self._idle = []
        if self._log is not None:
            self._log.close()
            self._log = None

    def compile(self, jobs: Iterable[CompileJob],
                done: Callable[[CompileJob, CompiledStep], None] | None = None) -> dict[CompileJob, CompiledStep]:
        """Compile every job, each worker on its own pipe, so a worker that dies (a libtpu abort,
        the kernel's OOM killer) costs exactly its own job, which gets a CompiledStep with the
        reason; a fresh worker takes the next job."""
        queue = list(jobs)
        results: dict[CompileJob, CompiledStep] = {}
        busy: dict[Any, tuple[_Worker, CompileJob]] = {}  # connection -> (worker, job)

        def finish(job: CompileJob, step: CompiledStep) -> None:
            results[job] = step
            if done:
                done(job, step)

        try:
            while queue or busy:
                while queue and len(busy) < self.workers:
                    worker = self._idle.pop() if self._idle else _Worker(self._log)
                    job = queue.pop(0)
                    worker.send.send(job)
                    busy[worker.connection] = (worker, job)
                ready = set(wait(list(busy)))  # a dead worker's pipe is ready too: at end of file
                for connection, (worker, job) in list(busy.items()):
                    if connection not in ready:
                        continue
                    del busy[connection]
                    try:
                        step = worker.connection.recv() if worker.connection.poll() else None
                    except (EOFError, OSError):
                        step = None
                    if step is None:
                        reason = _death(worker.exitcode())
                        where = f" (its output is in {self.log_path})" if self.log_path is not None else ""
                        log.warning("compile worker died on %s (%d blocks): %s%s", job.layout.name(), job.blocks, reason, where)
                        finish(job, CompiledStep(0, 0, 0, 0, 0, 0, [], 0.0, error=f"the compiler process died: {reason}"))
                        worker.close()
                    else:
                        finish(job, step)
                        self._idle.append(worker)
        finally:
            for worker, _ in busy.values():  # only after an exception: their jobs are abandoned
                worker.close(kill=True)
        return results


class _Worker:
    """A compiler process (`python -m tpu_tuner.planner.compile_pool`) on two pipes.

    A plain subprocess rather than multiprocessing's spawn, which re-imports the caller's main
    module and so breaks scripts that call `plan()` without a __main__ guard."""

    def __init__(self, output: IO[bytes] | None = None) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        self.process = subprocess.Popen([sys.executable, "-m", "tpu_tuner.planner.compile_pool", str(to_child_r), str(from_child_w)],
                                        pass_fds=(to_child_r, from_child_w), stdout=output, stderr=output,
                                        env={**os.environ, **child_environment()})
        os.close(to_child_r)
        os.close(from_child_w)
        self.send = Connection(to_child_w, readable=False)
        self.connection = Connection(from_child_r, writable=False)

    def exitcode(self) -> int | None:
        try:
            return self.process.wait(10)
        except subprocess.TimeoutExpired:
            return None

    def close(self, kill: bool = False) -> None:
        """End the worker: ask it to exit and wait, or with `kill` end it at once."""
        if not kill:
            try:
                self.send.send(None)
            except (BrokenPipeError, OSError):
                pass
        if kill or self.exitcode() is None:
            self.process.kill()
            self.process.wait()
        self.send.close()
        self.connection.close()


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
    receive, send = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    try:  # import the compile path's libraries while the caller still prepares its first job
        import jax  # noqa: F401

        from tpu_tuner.planner.torchax_compat import import_torchax

        import_torchax()
    except Exception:  # noqa: BLE001 - the first job reports the same failure, in its own words
        pass
    while (job := receive.recv()) is not None:
        try:
            step = run_job(job)
        except Exception as exc:  # noqa: BLE001 - a model the compiler cannot take is that layout's result
            step = CompiledStep(0, 0, 0, 0, 0, 0, [], 0.0, error=f"{type(exc).__name__}: {exc}".splitlines()[0])
        send.send(step)


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        return {"SIGKILL": "killed (SIGKILL; out of host memory?)", "SIGFPE": "SIGFPE inside libtpu (a compiler bug)",
                "SIGSEGV": "SIGSEGV inside libtpu", "SIGABRT": "libtpu aborted"}.get(name, name)
    return f"exit status {exitcode}"


@lru_cache(maxsize=4)
def topology_devices(jax_name: str) -> Any:
    """The devices of a TPU topology, for compile-only use (needs libtpu)."""
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    return topologies.get_topology_desc(topology_name=jax_name, platform="tpu").devices


@lru_cache(maxsize=4)
def _workload(model_file: str) -> Any:
    from tpu_tuner.model.loader import load_workload

    return load_workload(model_file)


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
