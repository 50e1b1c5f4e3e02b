"""Riding out a database server that cannot be reached for a while (a restart, an upgrade).

A storage call that fails because the server is unreachable is tried again with a growing pause
(`BACKOFF_S`, doubling up to `MAX_PAUSE_S`), each try logged as one progress line ("storage
unreachable: retrying, 12 s"), until it succeeds or the outage has lasted `limit_s`: then the
worker stops with `StorageUnreachable`, one line and a non-zero exit status, and relaunching it
resumes (docs/run-safety.md, "The database restarts"). Only calls that are safe to repeat go
through `Outages.call`: reads, and the journal's appends, which carry an id of their own so that
one whose commit was lost with the connection is not applied twice (studies/journal.py).

The outages a process rode out are kept (`recovered_at`, `unreachable_total_s`) so that the
liveness checks do not take a heartbeat gap the outage caused for a dead worker
(studies/liveness.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import sqlalchemy

from tpu_tuner.core.errors import TpuTuneError, first_line
from tpu_tuner.studies.storage import DEFAULT_STORAGE_RETRY_S

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_LIMIT_S = DEFAULT_STORAGE_RETRY_S
BACKOFF_S = 0.5  # the first pause
MAX_PAUSE_S = 5.0  # pauses double up to this: a progress line this often, and back at most this late

# libpq's connection parameters for a study server: a connect to an unreachable host gives up
# after 5 s (the default waits for TCP, minutes), and a connection whose peer vanished is found
# dead by keepalives within about 25 s (https://www.postgresql.org/docs/current/libpq-connect.html).
SERVER_CONNECT_ARGS = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}

_total_lock = threading.Lock()
_unreachable_total_s = 0.0  # every outage this process rode out, all storages together


class StorageUnreachable(TpuTuneError):
    """The study's database stayed unreachable past the retry limit (exit status 1)."""


def is_unreachable(exc: BaseException) -> bool:
    """Whether `exc` says the server could not be reached or dropped the connection (a restart, a
    shutdown, a refused or timed-out connect), rather than that a statement was wrong."""
    if isinstance(exc, sqlalchemy.exc.DisconnectionError):
        return True
    if isinstance(exc, sqlalchemy.exc.DBAPIError):
        return exc.connection_invalidated or isinstance(
            exc, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)
        )
    return False


def unreachable_total_s() -> float:
    """Seconds this process has spent unable to reach a storage, over the outages it rode out."""
    return _unreachable_total_s


class Outages:
    """Retries of one storage's calls while its server is unreachable, and when it last came back.

    `clock` and `sleep` are `time.monotonic` and `time.sleep` (replaced in tests)."""

    def __init__(
        self,
        where: str,
        limit_s: float = DEFAULT_LIMIT_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.where, self.limit_s, self.clock, self.sleep = where, limit_s, clock, sleep
        self.recovered_at: float | None = None  # `clock` when the last outage ended
        self._lock = threading.Lock()

    def quiet_for(self) -> float:
        """Seconds since the last outage ended (infinite when there was none)."""
        return float("inf") if self.recovered_at is None else self.clock() - self.recovered_at

    def call(self, attempt: Callable[[], T]) -> T:
        """`attempt()`, tried again while the server is unreachable, up to `limit_s` seconds.
        `attempt` must be safe to repeat after a failure whose outcome on the server is unknown."""
        down_since: float | None = None
        pause = BACKOFF_S
        while True:
            try:
                result = attempt()
            except Exception as exc:
                if not is_unreachable(exc):
                    raise
                now = self.clock()
                down_since = now if down_since is None else down_since
                down_s = now - down_since
                if down_s >= self.limit_s:
                    raise StorageUnreachable(
                        f"the study storage {self.where} was unreachable for {down_s:.0f} s, the limit "
                        f"(--storage-retry {self.limit_s:.0f}): this worker stopped; relaunch it to continue "
                        f"(--resume RUN_DIR, or the same --study); last error {first_line(exc)}"
                    ) from exc
                log.warning("storage unreachable: retrying, %.0f s (%s)", down_s, first_line(exc))
                self.sleep(min(pause, self.limit_s - down_s))
                pause = min(2 * pause, MAX_PAUSE_S)
                continue
            if down_since is not None:
                self._recovered(down_since)
            return result

    def _recovered(self, down_since: float) -> None:
        global _unreachable_total_s
        now = self.clock()
        with self._lock:
            self.recovered_at = now
        with _total_lock:
            _unreachable_total_s += now - down_since
        log.warning("storage reachable again after %.0f s", now - down_since)


__all__ = [
    "DEFAULT_LIMIT_S",
    "SERVER_CONNECT_ARGS",
    "Outages",
    "StorageUnreachable",
    "is_unreachable",
    "unreachable_total_s",
]
