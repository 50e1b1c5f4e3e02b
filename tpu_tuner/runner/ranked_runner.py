"""Trials on N ranks: the `TrialRunner` interface, each sharded job a fresh process group.

``tpu-tune MODEL.py --nproc N`` measures every setting as N processes, one per device (TorchTPU's
model: one process per device, its own process group). Each job that times or compares settings
(a request that runs a layout: `MeasureRequest`, `CompareRequest`, `ShardedStepRequest`) starts N
ranks of `runner.rank_job` through PyTorch's own launcher
(`runner.launch.run_ranks`: torch.distributed.elastic's `start_processes`), which stops every
rank when one dies; a hang is stopped at the job's deadline. The trial fails with the rank and
its reason, and the next job starts a new group: no process or rendezvous file outlives its job.
The other jobs (loading the file, the baseline profile, bucketing) describe the workload, not a
layout: they run in one single-process worker, as without ``--nproc``.

A fresh group per job, not warm ranks: each trial compiles as a fresh process would, and a rank
left in a broken collective can never poison the next trial. Its cost is a few seconds of start-up
per job (interpreters, imports, the rendezvous), which the trial's wall time shows.

What the ranks print goes to the runner's `WorkerLog` (the single worker's too), each rank's
output appended when its group ends.
"""

from __future__ import annotations

import logging
import pickle
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tpu_tuner.core.failures import FailureKind, with_device_cause
from tpu_tuner.execution.measurement import TrialFailure
from tpu_tuner.runner.requests import Request
from tpu_tuner.runner.trial_runner import JobResult, Runner, TrialRunner
from tpu_tuner.runner.worker_log import WorkerLog

log = logging.getLogger(__name__)


class RankedTrialRunner(TrialRunner):
    """Runs the requests that run a layout (`Request.on_ranks`) on `nproc` ranks and every other
    job in one worker, as `TrialRunner`; their output goes to `log` (None: a temporary one)."""

    # Each job is a fresh group: a comparison cannot keep its built steps between jobs, so its
    # rounds run in one job (tuning/verify/verification.py asks this).
    keeps_warm_steps = False

    def __init__(
        self,
        workload_path: str,
        device: str | None,
        nproc: int,
        timeout_s: float = 300.0,
        memory_limit_bytes: int | None = None,
        log: WorkerLog | None = None,
    ) -> None:
        super().__init__(workload_path, device, timeout_s, memory_limit_bytes, log=log)
        self.nproc = nproc
        # Per-rank start-up variables (a device of its own); set once the device kind is known.
        self.rank_environment: Callable[[int], dict[str, str]] | None = None
        # Variables every rank shares, decided once by the parent (Backend.launch_environment).
        self.launch_environment: dict[str, str] = {}
        self.device_kind: str | None = None  # the ranks' device kind, known once profiled
        self.nnodes = 1  # hosts every trial spans (runner/multi_host.py: more than one)
        self.groups_started = 0  # of `workers_started`: single-process workers plus process groups

    def run(self, request: Request, env: dict[str, str] | None = None, timeout_s: float | None = None) -> JobResult:
        """Run one job: on the ranks when it runs a layout, else in the single worker."""
        if not request.on_ranks:
            return super().run(request, env=env, timeout_s=timeout_s)
        self.check_usable()
        # The single worker is idle from here on (the profile is done): its memory and threads
        # are the ranks' now. A later single-process job starts it again.
        self.stop_worker()
        self.groups_started += 1
        self.workers_started += 1
        return self.run_group(request, env or {}, timeout_s or self.timeout_s)

    def run_group(self, request: Request, env: dict[str, str], limit: float) -> JobResult:
        """Run one job on a fresh group of `nproc` ranks, stopped after `limit` seconds."""
        from tpu_tuner.runner.launch import run_ranks
        from tpu_tuner.runner.rank_job import RESULT, read_accounts

        with tempfile.TemporaryDirectory(prefix="tpu-tune-trial-") as folder:
            job_file = Path(folder) / "job.pkl"
            job_file.write_bytes(pickle.dumps(self.rank_job(request)))
            since = self.log.mark()
            outcome = run_ranks(
                self.nproc,
                "tpu_tuner.runner.rank_job",
                [str(job_file)],
                limit,
                workdir=folder,
                # The run's variables (TorchTPU's compilation cache) for every rank, as for a worker.
                env={**self.launch_environment, **self.run_environment(), **env},
                rank_env=self.rank_environment,
                output=self.log,
            )
            if outcome.ok:
                return JobResult(value=pickle.loads((Path(folder) / RESULT).read_bytes()), seconds=outcome.seconds)
            # A rank's own account (`rank_account`), else the launcher's.
            failure = rank_account(
                read_accounts(job_file, range(outcome.ranks)), outcome.failed_rank, outcome.kind
            ) or TrialFailure(outcome.kind or FailureKind.ERROR, outcome.failure or "the ranks failed")
            # A rank's device may have logged what its Python error did not say (an out-of-memory).
            failure = TrialFailure(*with_device_cause(failure.kind, failure.message, self.log.tail(since)))
            # The ranks' accounts already quote the telling line; the log has the rest.
            note = self.log.failure_note(quote=False, since=since)
            return JobResult(
                failure=TrialFailure(failure.kind, failure.message + note), seconds=outcome.seconds, note=note
            )

    def rank_job(self, request: Request) -> dict[str, Any]:
        """What each rank of a job reads from its job file (`runner.rank_job`): `request`, and
        the workload and device it runs on."""
        return {
            "request": request,
            "workload_path": self.workload_path,
            "device": self.device,
            "memory_limit_bytes": self.memory_limit_bytes,
        }


def rank_account(
    accounts: Mapping[int, Mapping[str, str]],
    failed_rank: int | None,
    kind: FailureKind | None,
    where: Callable[[int], str] = lambda rank: "",
) -> TrialFailure | None:
    """The account a rank wrote of its job's error that says why the ranks failed: the first that is
    not only a lost peer (whose collectives failed when one rank raised), else the failed rank's where
    it exited with an error (`kind`); None where none says."""
    causes = sorted(rank for rank, account in accounts.items() if not _lost_peer(str(account.get("message", ""))))
    rank = causes[0] if causes else failed_rank if failed_rank in accounts and kind == FailureKind.ERROR else None
    if rank is None:
        return None
    account = accounts[rank]
    return TrialFailure(
        FailureKind(account.get("kind", FailureKind.ERROR)), f"rank {rank}{where(rank)}: {account.get('message', '')}"
    )


def _lost_peer(message: str) -> bool:
    """Whether a rank's error only says that another rank went away."""
    return any(
        marker in message
        for marker in ("Connection closed by peer", "Connection reset by peer", "remote worker crashing", "Broken pipe")
    )


def trial_runner(
    workload_path: str,
    device: str | None,
    nproc: int,
    timeout_s: float,
    memory_limit_bytes: int | None,
) -> Runner:
    """The runner for trials on `nproc` processes: a single worker for one, ranks for more; the
    workers' output goes to the runner's own log, which `runner.log.move_into` moves into the run
    folder once it exists."""
    if nproc == 1:
        return TrialRunner(workload_path, device, timeout_s, memory_limit_bytes)
    return RankedTrialRunner(workload_path, device, nproc, timeout_s, memory_limit_bytes)
