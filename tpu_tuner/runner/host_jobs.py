"""One job on the ranks of every host of a multi-host run, through the hosts' rendezvous store.

The driver (node 0) announces each job under ``job/<n>`` of the round's keys (`announce`): the
job a sharded trial's ranks run (its pickled request, as `RankedTrialRunner` writes it to a job
file), a re-rendezvous after a lost host, or the end of the run. Every host then starts its N
ranks of ``runner.rank_job`` through the launcher (`run_here`: global ranks node*N .. node*N+N-1
of M*N, meeting in the store under the job's prefix), and posts its outcome under
``job/<n>/outcome/<node>``: whether its ranks ended well, and if not, the launcher's account and
each rank's own. A host whose ranks fail posts ``job/<n>/abort``, and every host stops its ranks
when it sees that key or a host whose heartbeat stopped (`hosts.SILENT_S`): no rank waits for a
peer that is gone. The other hosts run `follow` until the driver announces the end.
"""

from __future__ import annotations

import logging
import pickle
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tpu_tuner.core.errors import first_line
from tpu_tuner.core.failures import FailureKind
from tpu_tuner.core.polling import poll
from tpu_tuner.runner.hosts import SILENT_S, HostGroup, HostsError
from tpu_tuner.runner.launch import run_ranks
from tpu_tuner.runner.worker_log import WorkerLog

log = logging.getLogger(__name__)
T = TypeVar("T")

POLL_S = 0.2
# How long the driver waits for the other hosts' outcomes once its own ranks ended, at most (a
# host that is alive reports within seconds: its ranks end with the driver's or are stopped).
GATHER_S = 60.0
# How long the driver waits for the other hosts to read the end before its store goes with it.
FAREWELL_S = 10.0


@dataclass
class HostOutcome:
    """How one host's ranks ran a job: `failure` is the launcher's account ("rank 3 died from
    SIGSEGV"), `accounts` each rank's own (global rank -> kind, message) where it wrote one."""

    node: int
    host: str
    ok: bool
    kind: FailureKind | None = None
    failure: str | None = None
    failed_rank: int | None = None
    accounts: dict[int, dict[str, str]] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass(frozen=True)
class FollowEnd:
    """How a follower's run ended: the jobs its ranks ran, and the driver's word at the end."""

    jobs: int
    reason: str
    failed: bool


def announce(group: HostGroup, payload: dict[str, Any]) -> int:
    """Announce the next job of this round to every host (the driver); returns its number."""
    number = group.next_job
    group.next_job += 1
    group.store.set(f"job/{number}", pickle.dumps(payload))
    return number


def next_announcement(group: HostGroup) -> tuple[int, dict[str, Any]]:
    """The driver's next announcement (a follower), waiting as long as the driver beats."""
    number = group.next_job
    key = f"job/{number}"

    def announced() -> bool | None:
        if group.store.check([key]):
            return True
        if (silent := group.silent_for(0)) > SILENT_S:
            raise HostsError(
                f"the driver, {group.host(0).describe()}, stopped answering (no heartbeat for "
                f"{silent:.0f} s): {_relaunch(group)}"
            )
        return None

    try:
        poll(announced, POLL_S)
        payload = pickle.loads(group.store.get(key))
    except HostsError:
        raise
    except Exception as exc:
        raise HostsError(
            f"the rendezvous store at {group.endpoint} went away with its host ({first_line(exc)}): {_relaunch(group)}"
        ) from exc
    group.next_job += 1
    return number, payload


def run_here(
    group: HostGroup,
    number: int,
    payload: dict[str, Any],
    output: WorkerLog,
    launch_env: dict[str, str],
    rank_env: Callable[[int], dict[str, str]] | None,
) -> tuple[HostOutcome, Any]:
    """This host's ranks of job `number`; posts their outcome and returns it with the job's value
    (rank 0's result, on the driver only)."""
    from tpu_tuner.runner.rank_job import RESULT, read_accounts

    me = group.me()
    with tempfile.TemporaryDirectory(prefix="tpu-tune-trial-") as folder:
        job_file = Path(folder) / "job.pkl"
        job_file.write_bytes(pickle.dumps(payload["spec"]))
        ranks = run_ranks(
            group.nproc,
            "tpu_tuner.runner.rank_job",
            [str(job_file)],
            float(payload["timeout_s"]),
            workdir=folder,
            env={**launch_env, **payload.get("env", {})},
            rank_env=rank_env,
            output=output,
            group=group.rank_group(number),
            abort=lambda: _abort_reason(group, number),
        )
        accounts = read_accounts(job_file, range(me.node * group.nproc, (me.node + 1) * group.nproc))
        result = Path(folder) / RESULT
        value = pickle.loads(result.read_bytes()) if ranks.ok and result.is_file() else None
    outcome = HostOutcome(
        node=me.node,
        host=me.host,
        ok=ranks.ok,
        kind=ranks.kind,
        failure=ranks.failure,
        failed_rank=ranks.failed_rank,
        accounts=accounts,
        seconds=ranks.seconds,
    )
    if not ranks.ok and ranks.kind != FailureKind.ABORTED:
        group.store.set(f"job/{number}/abort", f"the ranks of {me.describe()} failed: {ranks.failure}")
    post(group, number, outcome)
    return outcome, value


def post(group: HostGroup, number: int, outcome: HostOutcome | str) -> None:
    """Post this host's outcome of job `number` (or its word, for an end)."""
    group.store.set(f"job/{number}/outcome/{group.node}", pickle.dumps(outcome))


def gather(group: HostGroup, number: int, here: T, within_s: float = GATHER_S) -> tuple[dict[int, T], dict[int, float]]:
    """Every host's outcome of job `number` (the driver; `here`, its own), and the hosts that
    stopped answering instead (node -> seconds without a heartbeat; a host silent past `within_s`
    counts too)."""
    outcomes, lost = {group.me().node: here}, {}

    def all_heard() -> bool | None:
        for node in group.others():
            if node in outcomes or node in lost:
                continue
            key = f"job/{number}/outcome/{node}"
            if group.store.check([key]):
                outcomes[node] = pickle.loads(group.store.get(key))
            elif (silent := group.silent_for(node)) > SILENT_S:
                lost[node] = silent
        return True if len(outcomes) + len(lost) == group.nnodes else None

    if poll(all_heard, POLL_S / 2, within_s) is None:
        lost.update({node: within_s for node in group.others() if node not in outcomes and node not in lost})
    return outcomes, lost


def farewell(group: HostGroup, reason: str, failed: bool) -> None:
    """Announce the end (the driver) and wait, briefly, for the hosts still beating to read it:
    the store ends with the driver's process."""
    try:
        number = announce(group, {"kind": "end", "reason": reason, "failed": failed})
        gather(group, number, "bye", FAREWELL_S)  # each host's word that it read the end, as it posts it
    except Exception as exc:
        log.debug("announcing the end: %s", exc)


def follow(
    group: HostGroup,
    output: WorkerLog,
    environments: Callable[[str | None], tuple[dict[str, str], Callable[[int], dict[str, str]] | None]],
) -> FollowEnd:
    """A follower's run: each job the driver announces on this host's ranks, until the end.
    `environments(device_kind)` gives this host's launch variables and per-rank ones (TorchTPU's
    are decided on each host). `HostsError` when the driver goes away."""
    from torch.distributed import DistError

    jobs = 0
    try:
        while True:
            number, payload = next_announcement(group)
            kind = payload["kind"]
            if kind == "end":
                post(group, number, "bye")
                return FollowEnd(jobs, str(payload.get("reason", "")), bool(payload.get("failed")))
            if kind == "restart":
                log.warning(
                    "%s: re-rendezvous at %s (%s)", group.me().describe(), group.endpoint, payload.get("reason", "")
                )
                group.restart()
                continue
            try:
                launch_env, rank_env = environments(payload.get("device_kind"))
            except Exception as exc:
                post(
                    group,
                    number,
                    HostOutcome(
                        group.me().node,
                        group.me().host,
                        ok=False,
                        kind=FailureKind.ERROR,
                        failure=f"{group.me().describe()}: {first_line(exc)}",
                    ),
                )
                group.store.set(f"job/{number}/abort", f"{group.me().describe()} cannot start its ranks")
                continue
            run_here(group, number, payload, output, launch_env, rank_env)
            jobs += 1
    except DistError as exc:  # the store went away with its host (the driver's, in the usual case)
        raise HostsError(
            f"the rendezvous store at {group.endpoint} went away with its host ({first_line(exc)}): {_relaunch(group)}"
        ) from exc


def _abort_reason(group: HostGroup, number: int) -> str | None:
    """Why this host's ranks of job `number` must stop now, if they must: another host's ranks
    failed, or a host stopped answering (its ranks will never reach the next collective)."""
    try:
        if group.store.check([f"job/{number}/abort"]):
            return f"stopped: {group.store.get(f'job/{number}/abort').decode()}"
        for node in group.others():
            silent = group.silent_for(node)
            if silent > SILENT_S:
                reason = f"{group.host(node).describe()} stopped answering (no heartbeat for {silent:.0f} s)"
                group.store.set(f"job/{number}/abort", reason)
                return f"stopped: {reason}"
    except Exception as exc:
        return f"stopped: the rendezvous store went away ({first_line(exc)})"
    return None


def _relaunch(group: HostGroup) -> str:
    return (
        f"this host's ranks were stopped; the study is in its storage: relaunch the same command on every host "
        f"to resume it (run {group.run_id!r})"
    )


__all__ = [
    "FAREWELL_S",
    "GATHER_S",
    "FollowEnd",
    "HostOutcome",
    "announce",
    "farewell",
    "follow",
    "gather",
    "next_announcement",
    "post",
    "run_here",
]
