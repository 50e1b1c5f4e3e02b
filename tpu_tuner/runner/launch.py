"""Start N ranks with PyTorch's own launcher machinery and collect what they report.

`torch.distributed.elastic.multiprocessing.start_processes` (the layer torchrun's elastic agent
runs its workers through) starts the ranks as fresh interpreters, each in its own session; when
one exits non-zero (an exception, a segfault, the OOM killer's SIGKILL) it terminates the others
(SIGTERM, then SIGKILL). A hang has no exit to see: the deadline here closes the whole group the
same way, and a rank that froze (stopped: `runner.frozen`) closes it within `FROZEN_GRACE_S`.
The rendezvous is a file in the run's folder (``init_method="file://..."``: no port to pick or
leak), and every rank writes its report as JSON beside it. What the ranks print goes to
files of the launcher's, appended to the caller's `WorkerLog` when the group ends.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpu_tuner.core.failures import FailureKind, classify, describe_end
from tpu_tuner.core.tpu_host import child_environment
from tpu_tuner.runner.frozen import LOOK_S, Frozen, FrozenWatch
from tpu_tuner.runner.parent_death import die_with_parent
from tpu_tuner.runner.worker_log import WorkerLog, telling_line

# The process group's timeout for one collective, at least: a rank whose peer died usually hears
# at once (its connection closes), and the launcher stops every rank when one exits; a peer that
# hangs is caught by the deadline of `run_ranks`, which the timeout is raised to.
COLLECTIVE_TIMEOUT_S = 60.0


# Where the ranks of a group that spans hosts meet: a TCP store's HOST:PORT and this job's key prefix.
STORE_VARIABLE = "TPU_TUNE_STORE"
STORE_PREFIX_VARIABLE = "TPU_TUNE_STORE_PREFIX"
# The launcher's pid, which a rank checks it is still the child of (`die_with_launcher`).
PARENT_VARIABLE = "TPU_TUNE_LAUNCHER_PID"


@dataclass(frozen=True)
class RankGroup:
    """This host's place in a process group that spans hosts: its first global rank, the group's
    size, and the TCP store (HOST:PORT) and key prefix its ranks meet under."""

    first_rank: int
    world_size: int
    store: str
    prefix: str


@dataclass
class RanksResult:
    """What N ranks reported, or why they did not: ``failure`` names the first rank that failed."""

    reports: dict[int, dict[str, Any]] = field(default_factory=dict)
    failure: str | None = None
    kind: FailureKind | None = None  # CRASH, OOM, ERROR, TIMEOUT, HANG or ABORTED
    seconds: float = 0.0
    failed_rank: int | None = None  # the rank that failed first (None: none, or a hang)
    ranks: int = 0  # how many were started

    @property
    def ok(self) -> bool:
        return self.failure is None


def run_ranks(
    nproc: int,
    module: str,
    args: list[str],
    timeout_s: float,
    workdir: str | Path | None = None,
    env: dict[str, str] | None = None,
    rank_env: Callable[[int], dict[str, str]] | None = None,
    output: WorkerLog | None = None,
    group: RankGroup | None = None,
    abort: Callable[[], str | None] | None = None,
) -> RanksResult:
    """Run ``python -m <module> <args...>`` as ranks 0..nproc-1 of one process group.

    Each rank gets RANK / WORLD_SIZE / TPU_TUNE_RENDEZVOUS / TPU_TUNE_REPORT in its environment
    (see `init_rank`, `write_report`), plus `env` and its own `rank_env(rank)` (a device of its
    own). Returns every rank's report, or the failure of the rank that most likely caused the
    others' (a signal before an error exit, the launcher's own SIGTERM last, then the earliest):
    its exit status or signal, and the telling line of its stderr. Each rank's stdout and stderr
    are appended to `output` (None: dropped), under a line naming the rank.

    With `group`, these are this host's ranks of a group that spans hosts: global ranks
    ``group.first_rank + i`` of ``group.world_size``, meeting in the TCP store `group` names
    (`init_rank`). `abort`, asked every half second while the ranks run, stops them all when it
    returns a reason (another host's ranks failed, or its agent went away): kind ABORTED."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std, start_processes

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tpu-tune-ranks-", dir=workdir) as folder:
        root = Path(folder)
        from tpu_tuner.core.host import usable_cores

        # The cores this launcher may use (its affinity: a container's, or one simulated host's).
        threads = max(1, usable_cores() // nproc)
        first, world = (group.first_rank, group.world_size) if group is not None else (0, nproc)
        meeting = (
            {STORE_VARIABLE: group.store, STORE_PREFIX_VARIABLE: group.prefix}
            if group is not None
            else {"TPU_TUNE_RENDEZVOUS": str(root / "rendezvous")}
        )
        envs = {
            rank: {
                **os.environ,
                **child_environment(),
                "RANK": str(first + rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(nproc),
                **meeting,
                # A rank dies with its launcher (`die_with_launcher`): no orphan when it is SIGKILLed.
                PARENT_VARIABLE: str(os.getpid()),
                "TPU_TUNE_REPORT": str(root / f"report-{rank}.json"),
                "OMP_NUM_THREADS": str(threads),
                "PYTHONFAULTHANDLER": "1",
                # A peer that died ends a collective with an error at once; a live peer
                # that is slow (rank 0 computing the reference) is waited for till the deadline.
                "TPU_TUNE_COLLECTIVE_TIMEOUT": str(max(COLLECTIVE_TIMEOUT_S, timeout_s)),
                **(env or {}),
                **(rank_env(rank) if rank_env else {}),
            }
            for rank in range(nproc)
        }
        logs = DefaultLogsSpecs(log_dir=str(root / "logs"), redirects=Std.ALL)
        # The launcher logs every failed rank at ERROR on stderr; the failure is the caller's to
        # report (a trial's line names the rank and its reason), once.
        launcher_log = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
        launcher_level = launcher_log.level
        previous = {
            sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
        }
        result = RanksResult(ranks=nproc)
        context = None
        try:
            launcher_log.setLevel(logging.CRITICAL)
            context = start_processes(
                name="tpu-tune-rank",
                entrypoint=sys.executable,
                args={rank: ("-m", module, *args) for rank in range(nproc)},
                envs=envs,
                logs_specs=logs,
            )
            # start() installs handlers that turn these signals into exceptions in this process:
            # the tuner's own handling (Ctrl-C ends the study cleanly) must stay as it was.
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            outcome, stopped, frozen = _wait(context, timeout_s, abort, first)
            if frozen is not None:  # killed with the others as the group closes
                result.failure, result.kind = frozen.describe(), FailureKind.HANG
                result.failed_rank = int(frozen.name.split()[-1])
            elif stopped is not None:
                result.failure, result.kind = stopped, FailureKind.ABORTED
            elif outcome is None:
                result.failure = f"no rank finished within {timeout_s:g} s (a hang): every rank was stopped"
                result.kind = FailureKind.TIMEOUT
            elif outcome.is_failed():
                # The cause, not its echoes: the launcher's own SIGTERM to the others last, a
                # rank killed by a signal before one that exited with an error (its peers'
                # collectives fail when it dies), then the earliest.
                rank, failed = min(
                    outcome.failures.items(),
                    key=lambda item: (item[1].exitcode == -signal.SIGTERM, item[1].exitcode >= 0, item[1].timestamp),
                )
                # Named by its global rank (the same as its local one on a single host).
                said = _last_line(context, rank)
                result.failure = f"rank {first + rank} {describe_end(failed.exitcode)}{': ' + said if said else ''}"
                result.kind = classify(failed.exitcode, exit_is_error=True)
                result.failed_rank = first + rank
        finally:
            if context is not None:
                context.close(death_sig=signal.SIGKILL, timeout=5)
                if output is not None:
                    _append_outputs(context, nproc, module, output, first, world)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            launcher_log.setLevel(launcher_level)
        if result.ok:
            for rank in range(nproc):
                path = root / f"report-{rank}.json"
                if path.is_file():
                    result.reports[rank] = json.loads(path.read_text())
        result.seconds = time.perf_counter() - started
        return result


def init_rank(backend: str = "gloo") -> tuple[int, int]:
    """In a rank: join the process group `run_ranks` set up (`backend`: gloo on CPU tensors, the
    device backend's own otherwise); returns (rank, world size)."""
    from datetime import timedelta

    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = timedelta(seconds=float(os.environ.get("TPU_TUNE_COLLECTIVE_TIMEOUT", COLLECTIVE_TIMEOUT_S)))
    if STORE_VARIABLE in os.environ:
        # Ranks on several hosts: the hosts' rendezvous store (a TCP store) under this job's prefix.
        host, _, port = os.environ[STORE_VARIABLE].rpartition(":")
        store = dist.PrefixStore(
            os.environ[STORE_PREFIX_VARIABLE], dist.TCPStore(host, int(port), is_master=False, timeout=timeout)
        )
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        return rank, world
    dist.init_process_group(
        backend, init_method=f"file://{os.environ['TPU_TUNE_RENDEZVOUS']}", rank=rank, world_size=world, timeout=timeout
    )
    return rank, world


def die_with_launcher() -> None:
    """In a rank, first thing: be killed when the launcher that started it dies. `start_processes`
    puts each rank in a session of its own (`parent_death.die_with_parent`)."""
    die_with_parent(PARENT_VARIABLE)


def write_report(report: dict[str, Any]) -> None:
    """In a rank: hand `report` (JSON) back to `run_ranks`."""
    Path(os.environ["TPU_TUNE_REPORT"]).write_text(json.dumps(report))


def finish_rank() -> None:
    """In a rank, after `write_report`: leave the process group together, then exit at once.

    Interpreter teardown after a tensor-parallel step can abort ("terminate called without an
    active exception": a collective library thread still joinable when its owner is destroyed),
    and the launcher would see a rank die from SIGABRT after its report was written
    (docs/sharding.md, "Launching ranks"). Everything is written by now, so the rank skips
    teardown (`os._exit`), as distributed test harnesses do."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _wait(
    context: Any, timeout_s: float, abort: Callable[[], str | None] | None, first: int = 0
) -> tuple[Any, str | None, Frozen | None]:
    """The launcher's result once every rank ended or one failed (None at the deadline), or the
    reason `abort` gave to stop them first, or a rank that froze (stopped for `FROZEN_GRACE_S`)."""
    deadline = time.monotonic() + timeout_s
    watch = FrozenWatch()
    while True:
        outcome = context.wait(timeout=max(0.05, min(LOOK_S, deadline - time.monotonic())), period=0.05)
        if outcome is not None or time.monotonic() >= deadline:
            return outcome, None, None
        if (frozen := watch.look((pid, f"rank {first + rank}") for rank, pid in context.pids().items())) is not None:
            return None, None, frozen
        reason = abort() if abort is not None else None
        if reason is not None:
            return None, reason, None


def _last_line(context: Any, rank: int) -> str:
    """The line of a rank's stderr that says why it stopped (`worker_log.telling_line`)."""
    try:
        return telling_line(Path(context.stderrs[rank]).read_text(errors="replace"))
    except (OSError, KeyError, TypeError):
        return ""


def _append_outputs(
    context: Any, nproc: int, module: str, output: WorkerLog, first: int = 0, world: int | None = None
) -> None:
    """Each rank's stdout and stderr files (the launcher's, removed with the group's folder)
    appended to `output`, a header line before each that is not empty."""
    for rank in range(nproc):
        for stream, files in (("stdout", context.stdouts), ("stderr", context.stderrs)):
            try:
                data = Path(files[rank]).read_bytes()
            except (OSError, KeyError, TypeError):
                continue
            if data:
                output.write(
                    f"--- {module} rank {first + rank}/{world or nproc} {stream} ---\n".encode()
                    + data
                    + (b"" if data.endswith(b"\n") else b"\n")
                )
