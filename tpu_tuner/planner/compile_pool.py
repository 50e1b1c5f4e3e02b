"""Compile the planner's programs in worker processes, several at once.

Why processes: one TPU compile keeps about one core busy (measured: 29 s of CPU in 26 s of wall
time), so two workers on two cores halve a plan's wall time; a libtpu abort or a runaway compile
ends one worker, not the plan; and torchax, which breaks torch.compile in any process that imports
it, stays out of the caller's process. Workers are spawned (not forked: libtpu and JAX hold
threads) and live for the whole plan, so each pays the JAX / torchax / libtpu start-up once.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from multiprocessing.connection import wait
from typing import Any

from tpu_tuner.planner.layouts import Layout
from tpu_tuner.planner.program import CompiledStep, compile_step

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompileJob:
    """One program to compile: the model cut to `blocks` repeated blocks, on one layout."""

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


def default_workers() -> int:
    """One worker per core, at most 4 (each 70B compile holds a few GiB of host memory)."""
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def run_job(job: CompileJob) -> CompiledStep:
    """Compile `job` in this process (the workers' entry point)."""
    workload = _workload(job.model_file)
    return compile_step(lambda: workload.model_for_preset(job.preset), job.blocks, job.layout,
                        topology_devices(job.topology), job.global_batch, job.seq_len, job.d_model,
                        remat=job.remat, fast=job.fast)


def compile_all(jobs: Iterable[CompileJob], workers: int,
                done: Callable[[CompileJob, CompiledStep], None] | None = None) -> dict[CompileJob, CompiledStep]:
    """Compile every job on `workers` processes, each with its own pipe, so a worker that dies (a
    libtpu abort, the kernel's OOM killer) costs exactly its own job, which gets a CompiledStep
    with the reason; a fresh worker takes the next job."""
    queue = list(jobs)
    results: dict[CompileJob, CompiledStep] = {}
    # Compile-only use never touches a TPU; without this every worker after the first waits on
    # libtpu's exclusive /tmp/libtpu_lockfile.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    context = multiprocessing.get_context("spawn")
    idle: list[_Worker] = []
    busy: dict[Any, tuple[_Worker, CompileJob]] = {}  # connection -> (worker, job)

    def finish(job: CompileJob, step: CompiledStep) -> None:
        results[job] = step
        if done:
            done(job, step)

    try:
        while queue or busy:
            while queue and len(busy) < max(1, workers):
                worker = idle.pop() if idle else _Worker(context)
                job = queue.pop(0)
                worker.connection.send(job)
                busy[worker.connection] = (worker, job)
            ready = set(wait([*busy, *(w.process.sentinel for w, _ in busy.values())]))
            for connection, (worker, job) in list(busy.items()):
                if connection not in ready and worker.process.sentinel not in ready:
                    continue
                del busy[connection]
                try:
                    step = worker.connection.recv() if worker.connection.poll() else None
                except (EOFError, OSError):
                    step = None
                if step is None:
                    worker.process.join(timeout=5)
                    reason = _death(worker.process.exitcode)
                    log.warning("compile worker died on %s (%d blocks): %s", job.layout.name(), job.blocks, reason)
                    finish(job, CompiledStep(0, 0, 0, 0, 0, 0, [], 0.0, error=f"the compiler process died: {reason}"))
                    worker.close()
                else:
                    finish(job, step)
                    idle.append(worker)
    finally:
        for worker in idle + [w for w, _ in busy.values()]:
            worker.close()
    return results


class _Worker:
    """A spawned compiler process and the parent's end of its pipe."""

    def __init__(self, context: Any) -> None:
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child,), daemon=True)
        self.process.start()
        child.close()

    def close(self) -> None:
        try:
            self.connection.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
        self.connection.close()


def _serve(connection: Any) -> None:
    """The worker's loop: compile each job it is sent until it is sent None."""
    while (job := connection.recv()) is not None:
        try:
            step = run_job(job)
        except Exception as exc:  # noqa: BLE001 - a model the compiler cannot take is that layout's result
            step = CompiledStep(0, 0, 0, 0, 0, 0, [], 0.0, error=f"{type(exc).__name__}: {exc}".splitlines()[0])
        connection.send(step)


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
    from tpu_tuner.loader import load_workload

    return load_workload(model_file)
