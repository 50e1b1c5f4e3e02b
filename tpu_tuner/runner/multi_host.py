"""Trials that span hosts: the driver's runner, `RankedTrialRunner`'s interface over M hosts.

The driver (node 0 of the hosts' rendezvous, `runner/hosts.py`) runs the normal search with this
runner. A job that runs a layout (`Request.on_ranks`) is announced to every host through the
rendezvous store and runs on all M x N ranks at once (`runner/host_jobs.py`): global rank 0 is
the driver's first, so the measurement its job gathers over the ranks (the slowest rank's step,
the largest rank's memory, the guardrail on the gathered loss and gradients) comes back here as
on one host. Every other job (loading the file, the baseline profile) runs in the driver's single
worker only.

A host that stops answering during a job (its agent killed, its host down) fails that job naming
the host, as a trial failure of kind INTERRUPTED (`LOST_HOST`: the setting measured nothing and
is measured again, `tuning/search/trials.py`; HANG where its agent is on this machine and seen stopped:
SIGSTOP, `runner/frozen.py`); the other hosts' ranks are stopped. Then, with
``--max-restarts`` left, the hosts meet again before the next job (waiting for the lost one to be
started again); without, the run stops with `HostsError` before the next trial is asked
(`check_usable`), one line naming the host and how to resume.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Sequence

from tpu_tuner.core.failures import FailureKind
from tpu_tuner.execution.measurement import TrialFailure
from tpu_tuner.runner.frozen import is_stopped
from tpu_tuner.runner.host_jobs import HostOutcome, announce, gather, run_here
from tpu_tuner.runner.hosts import HostGroup, HostInfo, HostsError, HostsMissing
from tpu_tuner.runner.ranked_runner import RankedTrialRunner, rank_account
from tpu_tuner.runner.requests import Request
from tpu_tuner.runner.trial_runner import JobResult
from tpu_tuner.runner.worker_log import WorkerLog

log = logging.getLogger(__name__)

# The failure kind of a job a lost host cut short: the kind of a trial an interrupted run left
# behind (it covers no setting and teaches the study nothing).
LOST_HOST = FailureKind.INTERRUPTED
# Which failure to report when several hosts' ranks failed without an account of their own: a
# signal before an error exit before a hang.
_PRIORITY = {
    FailureKind.HANG: 0,
    FailureKind.CRASH: 0,
    FailureKind.OOM: 0,
    FailureKind.ERROR: 1,
    FailureKind.TIMEOUT: 2,
}


class MultiHostTrialRunner(RankedTrialRunner):
    """Runs the requests that run a layout on the `nproc` ranks of each of `group`'s hosts (this
    one the driver) and every other job in one worker here."""

    def __init__(
        self,
        workload_path: str,
        device: str | None,
        group: HostGroup,
        timeout_s: float = 300.0,
        memory_limit_bytes: int | None = None,
        log: WorkerLog | None = None,
    ) -> None:
        super().__init__(workload_path, device, group.nproc, timeout_s, memory_limit_bytes, log=log)
        self.group = group
        self.nnodes = group.nnodes
        self.lost: str | None = None  # why no job can run any more (a host lost, no restart left)
        self._restart_due: str | None = None  # a host was lost: meet again before the next job

    def check_usable(self) -> None:
        """Meet the hosts again where one was lost (with restarts left); `HostsError` when the run
        cannot go on. The search calls it before each ask, so no trial is left running."""
        if self._restart_due is not None:
            self._restart()
        if self.lost is not None:
            raise HostsError(self.lost)

    def run_group(self, request: Request, env: dict[str, str], limit: float) -> JobResult:
        """Run one job on every host's ranks, stopped after `limit` seconds."""
        from torch.distributed import DistError

        payload = {
            "kind": "run",
            "timeout_s": limit,
            "env": dict(env),
            "device_kind": self.device_kind,
            "spec": self.rank_job(request),
        }
        since, started = self.log.mark(), time.perf_counter()
        try:
            number = announce(self.group, payload)
            here, value = run_here(
                self.group, number, payload, self.log, self.launch_environment, self.rank_environment
            )
            outcomes, lost = gather(self.group, number, here)
        except DistError as exc:  # the store went away with the host that served it
            self.lost = (
                f"the rendezvous store at {self.group.endpoint} went away with its host "
                f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}): {self._resume()}"
            )
            return JobResult(failure=TrialFailure(LOST_HOST, self.lost), seconds=time.perf_counter() - started)
        seconds = time.perf_counter() - started
        if lost:
            return JobResult(failure=TrialFailure(_lost_kind(self.group, lost), self._host_lost(lost)), seconds=seconds)
        if all(outcome.ok for outcome in outcomes.values()):
            ran = tuple(self.group.host(node).describe() for node in sorted(outcomes))
            return JobResult(value=value, seconds=seconds, hosts=ran)
        failure = host_cause(outcomes)
        note = self.log.failure_note(quote=False, since=since)  # the driver's ranks' log; each host keeps its own
        return JobResult(failure=TrialFailure(failure.kind, failure.message + note), seconds=seconds, note=note)

    def describe_hosts(self, layouts: Sequence[str] = ()) -> list[str]:
        """The hosts and the ranks each holds, then how each of `layouts` maps onto them (the mesh
        coordinates each host holds, which axes cross hosts): the run's findings."""
        from tpu_tuner.model.meshes.host_mesh import describe_on_hosts
        from tpu_tuner.model.meshes.layouts import parse_layout

        n = self.nproc
        lines = [
            f"{h.describe()}: rank{'s' if n > 1 else ''} {f'{h.node * n}-{h.node * n + n - 1}' if n > 1 else h.node}"
            for h in self.group.hosts
        ]
        names = [h.host for h in self.group.hosts]
        return lines + [
            describe_on_hosts(parse_layout(layout, context=False), self.nnodes, n, names) for layout in layouts
        ]

    def _host_lost(self, lost: dict[int, float]) -> str:
        """The failure of a job whose hosts in `lost` stopped answering, deciding what comes next."""
        message = "; ".join(
            f"{self.group.host(node).describe()} stopped answering during this trial (no heartbeat "
            f"for {silent:.0f} s): {_silence_cause(self.group.host(node))}"
            for node, silent in lost.items()
        )
        message += "; the other hosts' ranks were stopped"
        if self.group.restarts < self.group.max_restarts:
            self._restart_due = message
        else:
            self.lost = f"{message}; no restart left (--max-restarts {self.group.max_restarts}): {self._resume()}"
        return message

    def _restart(self) -> None:
        reason, self._restart_due = self._restart_due, None
        try:
            announce(self.group, {"kind": "restart", "reason": reason})
            log.warning(
                "re-rendezvous %d of %d at %s: waiting up to %.0f s for the lost host to be started again",
                self.group.restarts + 1,
                self.group.max_restarts,
                self.group.endpoint,
                self.group.timeout_s,
            )
            self.group.restart()
        except (HostsMissing, HostsError) as exc:
            self.lost = f"{reason}; the re-rendezvous failed: {exc}"
        except Exception as exc:
            self.lost = f"{reason}; the re-rendezvous failed ({type(exc).__name__}: {exc}): {self._resume()}"

    def _resume(self) -> str:
        return (
            f"relaunch the same command on every host to resume study {self.group.run_id!r} (nothing measured "
            "is lost or measured again)"
        )


def _frozen_here(host: HostInfo) -> bool:
    """Whether `host`'s agent runs on this machine and is stopped (SIGSTOP): a remote one cannot be told from dead."""
    return host.host == socket.gethostname() and is_stopped(host.pid)


def _silence_cause(host: HostInfo) -> str:
    return "its agent froze (stopped, SIGSTOP)" if _frozen_here(host) else "its agent died or its host went down"


def _lost_kind(group: HostGroup, lost: dict[int, float]) -> FailureKind:
    """HANG where a lost host's agent is seen frozen here, else `LOST_HOST`: measured again either way."""
    return FailureKind.HANG if any(_frozen_here(group.host(node)) for node in lost) else LOST_HOST


def host_cause(outcomes: dict[int, HostOutcome]) -> TrialFailure:
    """Why the ranks failed, over every host: a rank's own account (`rank_account`), else the
    launcher's on the host whose ranks failed first in kind (a signal, an exit, a hang), else what stopped them."""
    accounts = {rank: account for o in outcomes.values() for rank, account in o.accounts.items()}
    hosts = {rank: f" (node {o.node}, {o.host})" for o in outcomes.values() for rank in o.accounts}
    failed = sorted(
        (o for o in outcomes.values() if not o.ok and o.kind != FailureKind.ABORTED),
        key=lambda o: (_PRIORITY.get(o.kind or FailureKind.ERROR, 1), o.node),
    )
    first = failed[0] if failed else next(o for o in outcomes.values() if not o.ok)
    kind = (first.kind or FailureKind.ERROR) if failed else FailureKind.ERROR
    return rank_account(accounts, first.failed_rank if failed else None, kind, hosts.__getitem__) or TrialFailure(
        kind, f"{first.failure} (node {first.node}, {first.host})"
    )


__all__ = ["LOST_HOST", "MultiHostTrialRunner", "host_cause"]
