"""The hosts of a multi-host run, joined through torch's elastic rendezvous (c10d).

``tpu-tune MODEL.py --nnodes M --nproc N --rdzv HOST:PORT --study NAME`` runs on every host; each
host's process (its agent) joins one c10d rendezvous, as torchrun's agents do: a
`DynamicRendezvousHandler` over a `C10dRendezvousBackend` whose state lives in a TCP store at
HOST:PORT, hosted by the agent on that host (the first there to bind the port, as torch decides
it), under the study's name as the run id. The rendezvous completes when M agents are in it; an
agent missing after ``--rdzv-timeout`` fails every agent that waited with one line naming what is
missing (`HostsMissing`).

Once the rendezvous completes the agents agree on node ranks through its store: an agent that
had one keeps it (a re-rendezvous after a lost host changes no survivor's role), ``--node-rank``
(or TorchTPU's own NODE_RANK on a TPU slice) fixes one, the agent hosting the store takes node 0
(it is the driver: the run's coordination cannot outlive the store anyway), the rest fill the
free ranks in the rendezvous's order. Node k's ranks are global ranks k*N .. k*N+N-1.

Every agent then keeps a heartbeat in the store (a counter it adds to every second, from a
thread with a connection of its own), and reads the others': a host whose counter stops is named
(`silent_for`). The store's keys of one rendezvous round sit under a prefix of their own (a
generation), so a round after a lost host starts clean; the store itself lives in its host's
process and ends with it: nothing outlives the run.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from contextlib import suppress
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from tpu_tuner.core.errors import TpuTuneError
from tpu_tuner.runner.gloo_interface import pin_gloo_interface
from tpu_tuner.runner.launch import RankGroup

log = logging.getLogger(__name__)

# Seconds between an agent's heartbeats, and of silence after which a host counts as gone: long
# enough for an agent on a loaded host (its ranks starting up on every core) to beat.
BEAT_S = 1.0
SILENT_S = 6.0
# The rendezvous's own keep-alive (seconds, beats): a dead agent leaves the rendezvous state after
# their product, so a re-rendezvous after a lost host completes that soon after it comes back.
KEEP_ALIVE_S, KEEP_ALIVE_BEATS = 2, 3


class HostsError(TpuTuneError):
    """A host of the run went away (its agent died, or the rendezvous store did): the run stops."""


class HostsMissing(TpuTuneError):
    """The hosts did not all arrive at the rendezvous in time (exit status 2, like a bad flag)."""

    exit_status = 2


@dataclass(frozen=True)
class HostInfo:
    """One agent of the run: its node rank, host name and process id."""

    node: int
    host: str
    pid: int

    def describe(self) -> str:
        return f"host {self.host} (node {self.node}, agent pid {self.pid})"


class HostGroup:
    """This host's agent in a run of `nnodes` hosts of `nproc` ranks each (see the module).

    `join()` meets the other agents; then `node`, `hosts` and `store` (this round's keys) hold,
    and `silent_for(node)` says how long a host's heartbeat has not moved. `restart()` meets them
    again after a lost host (at most `max_restarts` times); `close()` stops the heartbeat."""

    def __init__(
        self,
        endpoint: str,
        run_id: str,
        nnodes: int,
        nproc: int,
        timeout_s: float,
        node_rank: int | None = None,
        max_restarts: int = 0,
    ) -> None:
        self.endpoint, self.run_id, self.nnodes, self.nproc = endpoint, run_id, nnodes, nproc
        self.timeout_s, self.max_restarts = timeout_s, max_restarts
        self.address, _, port = endpoint.rpartition(":")
        self.port = int(port)
        self.wanted = node_rank
        self.node: int | None = None
        self.hosts: tuple[HostInfo, ...] = ()
        self.hosts_store = False  # whether this agent's process serves the rendezvous store
        self.restarts = 0
        self.next_job = 0  # the number of the next job announced in this round (runner/host_jobs.py)
        self.prefix = ""
        self.store: Any = None
        self._raw: Any = None
        self._handler: Any = None
        self._beats: dict[int, tuple[int, float]] = {}
        self._stop = threading.Event()
        self._beat_thread: threading.Thread | None = None

    @property
    def is_driver(self) -> bool:
        """Node 0 asks the study and sends every host its jobs."""
        return self.node == 0

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc

    def host(self, node: int) -> HostInfo:
        return next(h for h in self.hosts if h.node == node)

    def me(self) -> HostInfo:
        assert self.node is not None, "join() first"
        return self.host(self.node)

    def others(self) -> list[int]:
        return [h.node for h in self.hosts if h.node != self.node]

    def join(self) -> None:
        """Open (or serve) the rendezvous store, meet the other agents, agree on node ranks and
        start beating. `HostsMissing` when they do not all come within the timeout."""
        from torch.distributed.elastic.rendezvous import RendezvousParameters
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

        self._raw, self.hosts_store = _open_store(self.address, self.port, self.timeout_s)
        pin_gloo_interface(self.address, self.port)  # before any rank starts: they inherit it
        params = RendezvousParameters(
            backend="c10d",
            endpoint=self.endpoint,
            run_id=self.run_id,
            min_nodes=self.nnodes,
            max_nodes=self.nnodes,
            join_timeout=math.ceil(self.timeout_s),
            last_call_timeout=1,
            keep_alive_interval=KEEP_ALIVE_S,
            keep_alive_max_attempt=KEEP_ALIVE_BEATS,
        )
        self._handler = create_handler(self._raw, C10dRendezvousBackend(self._raw, self.run_id), params)
        self._meet()

    def restart(self) -> None:
        """Meet again after a lost host (it has to come back: the run keeps its M hosts); every
        survivor keeps its node rank. `HostsMissing` when it does not come in time."""
        self._stop_beating()
        self.restarts += 1
        self._meet()

    def rank_group(self, job: int) -> RankGroup:
        """Where this host's ranks of job `job` meet the others' (`launch.init_rank`)."""
        assert self.node is not None
        return RankGroup(
            first_rank=self.node * self.nproc,
            world_size=self.world_size,
            store=self.endpoint,
            prefix=f"{self.prefix}/job/{job}/pg",
        )

    def silent_for(self, node: int) -> float:
        """Seconds since this agent last saw node `node`'s heartbeat move (0 the first time it looks)."""
        count = int(self.store.add(f"beat/{node}", 0))
        now = time.monotonic()
        seen = self._beats.get(node)
        if seen is None or seen[0] != count:
            self._beats[node] = (count, now)
            return 0.0
        return now - seen[1]

    def close(self) -> None:
        """Stop beating and release the store (its server too, where this agent hosts it)."""
        self._stop_beating()
        if self._handler is not None:
            # torch warns when the store is gone with its host; the run has said so in its own line.
            torch_log = logging.getLogger("torch.distributed.elastic.rendezvous.dynamic_rendezvous")
            level = torch_log.level
            torch_log.setLevel(logging.ERROR)
            try:
                self._handler.shutdown()  # stops the rendezvous's own keep-alive thread
            except Exception as exc:
                log.debug("closing the rendezvous: %s", exc)
            finally:
                torch_log.setLevel(level)
        self._handler = self.store = self._raw = None

    # --- the rendezvous ------------------------------------------------------------------------

    def _meet(self) -> None:
        from torch.distributed import PrefixStore
        from torch.distributed.elastic.rendezvous import RendezvousError, RendezvousTimeoutError

        waiting = f"tpu-tune/{self.run_id}/waiting"  # agents inside next_rendezvous, for the timeout's line
        self._raw.add(waiting, 1)
        # torch's agent store for workers (a second TCP server on node 0) is not used: the ranks
        # meet in this store under a job prefix (`rank_group`), so no other port is opened.
        previous = os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
        os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        started = time.monotonic()
        try:
            info = self._handler.next_rendezvous()
        except RendezvousTimeoutError as exc:
            joined = int(self._raw.add(waiting, 0))
            raise HostsMissing(
                f"waited {time.monotonic() - started:.0f} s at {self.endpoint} for {self.nnodes} hosts; "
                f"{joined} joined (--rdzv-timeout {self.timeout_s:g} s: start the same command on every "
                "host, or raise it)"
            ) from exc
        except RendezvousError as exc:
            raise HostsError(f"the rendezvous at {self.endpoint} failed: {exc}") from exc
        finally:
            _restore("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", previous)
            with suppress(Exception):
                self._raw.add(waiting, -1)
        log.info(
            "rendezvous at %s: %d hosts met in %.1f s (this agent is its rank %d)",
            self.endpoint,
            info.world_size,
            time.monotonic() - started,
            info.rank,
        )
        claims = self._claims(info)
        nodes = assign_nodes(claims)
        self.node = nodes[info.rank]
        self.hosts = tuple(
            sorted((HostInfo(nodes[r], c["host"], c["pid"]) for r, c in enumerate(claims)), key=lambda h: h.node)
        )
        self.prefix = f"tpu-tune/{self.run_id}/{claims[0]['generation']}"
        self.store = PrefixStore(self.prefix, self._raw)
        self.next_job = 0
        self._beats = {}
        server = [self.hosts[nodes[r]] for r, c in enumerate(claims) if c["store_host"]]
        if server and server[0].node != 0:
            log.warning(
                "the rendezvous store at %s is served by %s, not by the driver (node 0): if that host "
                "goes down the run stops",
                self.endpoint,
                server[0].describe(),
            )
        self._start_beating()

    def _claims(self, info: Any) -> list[dict[str, Any]]:
        """Every agent's claim (host, pid, the node rank it keeps or was given, whether it serves
        the store; rendezvous rank 0's also names this round's generation), by rendezvous rank."""
        mine = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "want": self.node if self.node is not None else self.wanted,
            "store_host": self.hosts_store,
            "generation": uuid.uuid4().hex[:12],
        }
        info.store.set(f"tpu-tune/claim/{info.rank}", json.dumps(mine))
        try:
            return [json.loads(info.store.get(f"tpu-tune/claim/{rank}")) for rank in range(info.world_size)]
        except Exception as exc:
            raise HostsMissing(
                f"the hosts met at {self.endpoint} but not all of them said who they are within "
                f"{self.timeout_s:g} s ({exc})"
            ) from exc

    # --- heartbeats ----------------------------------------------------------------------------

    def _start_beating(self) -> None:
        from torch.distributed import PrefixStore

        self._stop = threading.Event()
        # A connection of its own: a slow call on the main one never holds a beat back.
        beats = PrefixStore(self.prefix, self._raw.clone())
        key, stop = f"beat/{self.node}", self._stop

        def beat() -> None:
            while not stop.is_set():
                try:
                    beats.add(key, 1)
                except Exception as exc:
                    log.debug("heartbeat: %s", exc)
                stop.wait(BEAT_S)

        beats.add(key, 1)
        self._beat_thread = threading.Thread(target=beat, name="tpu-tune-host-beat", daemon=True)
        self._beat_thread.start()

    def _stop_beating(self) -> None:
        self._stop.set()
        if self._beat_thread is not None:
            self._beat_thread.join(timeout=2 * BEAT_S)
            self._beat_thread = None


def assign_nodes(claims: list[dict[str, Any]]) -> list[int]:
    """Node ranks by rendezvous rank: a claimed one kept (two claiming one are refused), node 0 to
    the agent serving the store where nobody claimed it, the rest in rendezvous order."""
    taken: dict[int, int] = {}
    for rank, claim in enumerate(claims):
        want = claim.get("want")
        if want is None:
            continue
        if want in taken:
            other = claims[taken[want]]
            raise HostsError(
                f"node rank {want} is claimed by both {other['host']} (pid {other['pid']}) and "
                f"{claim['host']} (pid {claim['pid']}): give each host its own --node-rank"
            )
        taken[want] = rank
    if 0 not in taken:
        serving = [rank for rank, claim in enumerate(claims) if claim.get("store_host") and claim.get("want") is None]
        if serving:
            taken[0] = serving[0]
    free = iter(node for node in range(len(claims)) if node not in taken)
    placed = set(taken.values())
    for rank in range(len(claims)):
        if rank not in placed:
            taken[next(free)] = rank
    nodes = [0] * len(claims)
    for node, rank in taken.items():
        nodes[rank] = node
    return nodes


def _open_store(address: str, port: int, timeout_s: float) -> tuple[Any, bool]:
    """The rendezvous's TCP store: served here when `address` is this machine and the port is
    free (torch's c10d backend decides the same way), else a client of it; and which."""
    from torch.distributed import TCPStore

    timeout = timedelta(seconds=timeout_s)
    if is_this_machine(address):
        try:
            return TCPStore(address, port, is_master=True, multi_tenant=True, timeout=timeout), True
        except (RuntimeError, ValueError):  # another agent of this machine serves it
            pass
    try:
        return TCPStore(address, port, is_master=False, timeout=timeout), False
    except (RuntimeError, ValueError, TimeoutError) as exc:
        raise HostsMissing(
            f"no rendezvous answered at {address}:{port} within {timeout_s:g} s: start the same "
            "command on that host too, or check --rdzv"
        ) from exc


def is_this_machine(address: str) -> bool:
    """Whether `address` names this machine: localhost, a loopback address, its host name or FQDN,
    an address one of its interfaces holds (in its network namespace: it can be bound), or one of
    the addresses its name resolves to."""
    import ipaddress

    if address in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        if ipaddress.ip_address(address).is_loopback:
            return True
    except ValueError:
        pass
    if _can_bind(address):
        return True
    try:
        ours = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
        theirs = {info[4][0] for info in socket.getaddrinfo(address, None)}
    except (OSError, UnicodeError):
        return False
    return bool(ours & theirs)


def _can_bind(address: str) -> bool:
    """Whether a socket here can listen on `address` (port 0: any free one), i.e. an interface of
    this machine's network namespace holds it; a host with addresses of its own but one name."""
    try:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family) as probe:
            probe.bind((address, 0))
        return True
    except (OSError, OverflowError):
        return False


def _restore(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


__all__ = ["BEAT_S", "SILENT_S", "HostGroup", "HostInfo", "HostsError", "HostsMissing", "assign_nodes"]
