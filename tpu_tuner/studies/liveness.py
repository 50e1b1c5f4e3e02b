"""Which workers of a study are alive: Optuna's heartbeats and its retry of stale trials.

Every trial records a heartbeat in the storage while it runs (a thread of the worker that asked
for it, beating every `interval_s`). Any worker of the study fails the RUNNING trials whose last
beat is older than the grace period (`fail_lost_trials`, Optuna's `fail_stale_trials`), and
Optuna's `RetryHeartbeatStaleTrialCallback` queues each such trial's setting again, once: a
worker killed with SIGKILL, or a host lost, costs the study its running trial and nothing else,
while the trials of live workers (beating) are never touched. A lost trial carries no
`failure_kind` (nobody was left to record one): `is_lost` tells it from a measured failure.

This replaces, for a shared study, marking every RUNNING trial "interrupted" on resume, which
would fail the live trials of the other workers (docs/tuning.md, "Many workers, one study").
"""

from __future__ import annotations

import copy
import logging
import os
import socket
import threading
import time
import uuid
import warnings
import weakref
from dataclasses import dataclass
from types import TracebackType

import optuna
import sqlalchemy
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.engine.interfaces import DBAPIConnection

from tpu_tuner.studies import outage, records
from tpu_tuner.studies.journal import JournalStudyStorage
from tpu_tuner.studies.storage import HEARTBEAT_INTERVAL_S, keeps_journal, sqlite_pragmas
from tpu_tuner.studies.study_trial import StudyTrial

log = logging.getLogger(__name__)

# A study's storage: Optuna's RDBStorage (SQLite, MySQL) or the journal on PostgreSQL; both beat.
StudyStorage = RDBStorage | JournalStudyStorage

# Seconds between a running trial's heartbeats, and without one before other workers call it
# lost. The grace period is three beats, not Optuna's two: a beat written by a thread of a process
# that also compiles can come a few seconds late on a busy host.
GRACE_BEATS = 3
# A lost trial is measured again at most this many times (a setting that kills its worker every
# time must not eat the budget).
MAX_RETRIES = 1


# Tries at opening a storage whose tables another worker may be creating at the same moment.
SCHEMA_ATTEMPTS = 5


def default_grace_period(interval_s: int) -> int:
    """The grace period used when none is given: `GRACE_BEATS` heartbeats."""
    return GRACE_BEATS * interval_s


def open_storage(
    url: str,
    interval_s: int = HEARTBEAT_INTERVAL_S,
    grace_period_s: int | None = None,
    retry_limit_s: float = outage.DEFAULT_LIMIT_S,
) -> StudyStorage:
    """The storage for `url`, whose trials keep heartbeats and whose lost trials are retried.

    PostgreSQL: a `JournalStudyStorage` (studies/journal.py), a trial's operations appended to a
    journal, a few milliseconds a trial where Optuna's `RDBStorage` spent a hundred
    (docs/many-workers.md). A server connection that sat idle in the pool is checked before use
    (`ping_when_idle`), so one the server closed during a long trial is replaced; while the
    server cannot be reached, calls are retried for up to `retry_limit_s` (studies/outage.py), a
    connect giving up after `CONNECT_TIMEOUT_S` and a dead peer found by TCP keepalives.

    Any other URL (SQLite, the default; MySQL): Optuna's `RDBStorage`, which optuna-dashboard
    reads. SQLite: every transaction starts with ``BEGIN IMMEDIATE`` (the write lock at once),
    because Optuna pops a queued trial by reading it WAITING and then writing it RUNNING, and
    SQLite ignores the ``FOR UPDATE`` that makes this atomic on a server: without it, three
    processes popping 200 queued trials from one SQLite study took 22 of them twice. It also
    waits up to a minute for that lock (the default, 5 s, was too short for several workers),
    and keeps a write-ahead log on a local disk (`storage.sqlite_pragmas`).
    """
    grace = grace_period_s if grace_period_s is not None else default_grace_period(interval_s)
    if keeps_journal(url):
        engine = sqlalchemy.create_engine(url, connect_args=dict(outage.SERVER_CONNECT_ARGS))
        ping_when_idle(engine)
        outages = outage.Outages(engine.url.render_as_string(hide_password=True), retry_limit_s)
        return JournalStudyStorage(url, engine, interval_s, grace, RetryLostTrial(), outages)
    sqlite = url.startswith("sqlite")
    # isolation_level None: the driver starts no transaction itself; the "begin" hook below does.
    engine_kwargs: dict[str, object] = {"connect_args": {"timeout": 60, "isolation_level": None}} if sqlite else {}
    for attempt in range(SCHEMA_ATTEMPTS):
        try:
            # Both are Optuna's documented mechanism, marked experimental since 2.8 / 2.9.
            with warnings.catch_warnings(action="ignore", category=optuna.exceptions.ExperimentalWarning):
                storage = RDBStorage(
                    url,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=interval_s,
                    grace_period=grace,
                    heartbeat_stale_trial_callback=RetryLostTrial(),
                )
            break
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError):
            # Workers that start together on a new database race to create its tables ("table
            # study_directions already exists", "UNIQUE constraint failed: alembic_version"):
            # the loser finds them made when it tries again.
            if attempt == SCHEMA_ATTEMPTS - 1:
                raise
            time.sleep(0.5 * (attempt + 1))
    if sqlite:
        sqlalchemy.event.listen(storage.engine, "begin", _begin_immediate)
        if pragmas := sqlite_pragmas(storage.engine.url.database):

            def set_pragmas(dbapi_connection: DBAPIConnection, record: sqlalchemy.pool.ConnectionPoolEntry) -> None:
                for pragma in pragmas:
                    dbapi_connection.execute(pragma)

            sqlalchemy.event.listen(storage.engine, "connect", set_pragmas)
            storage.engine.dispose()  # the connections Optuna opened to make the schema: without them
    return storage


def read_storage(url: str) -> StudyStorage:
    """A storage to read the studies of `url` with: the journal on PostgreSQL, else Optuna's
    `RDBStorage` as `optuna.load_study(storage=url)` opens it (no SQLite write lock taken)."""
    return open_storage(url) if keeps_journal(url) else RDBStorage(url)


# A pooled server connection idle longer than this is pinged before use. SQLAlchemy's
# `pool_pre_ping` pings at every checkout: Optuna checks a connection out for every storage call,
# so that was a round trip on each of the ~26 transactions of a trial (docs/many-workers.md,
# "Storage overhead per trial"); a connection back in the pool for under a second was alive then.
PING_IDLE_S = 1.0


def ping_when_idle(engine: sqlalchemy.engine.Engine) -> None:
    """Check a pooled connection before use when it has been idle over `PING_IDLE_S`; one that
    fails the check (the server closed it, or restarted) is replaced by a fresh connection."""

    def checked_in(dbapi_connection: DBAPIConnection, record: sqlalchemy.pool.ConnectionPoolEntry) -> None:
        record.info["idle_since"] = time.monotonic()

    def checkout(
        dbapi_connection: DBAPIConnection,
        record: sqlalchemy.pool.ConnectionPoolEntry,
        proxy: sqlalchemy.pool.PoolProxiedConnection,
    ) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since <= PING_IDLE_S:
            return  # a new connection, or one in use a moment ago
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise sqlalchemy.exc.DisconnectionError(f"idle connection lost: {type(exc).__name__}") from exc

    sqlalchemy.event.listen(engine.pool, "checkin", checked_in)
    sqlalchemy.event.listen(engine.pool, "checkout", checkout)


def _begin_immediate(connection: sqlalchemy.engine.Connection) -> None:
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def set_liveness(storage: StudyStorage, interval_s: int, grace_period_s: int | None) -> None:
    """Make `storage` beat and judge staleness as the study's workers agreed (a worker that judged
    others by a shorter grace period than theirs would fail their live trials)."""
    storage.heartbeat_interval = interval_s
    storage.grace_period = grace_period_s if grace_period_s is not None else default_grace_period(interval_s)


class RetryLostTrial(optuna.storages.RetryHeartbeatStaleTrialCallback):
    """Optuna's retry of a stale trial (queued again, at most `MAX_RETRIES` times), carrying none
    of the lost run's attributes but how the setting was first queued (a warm start's origin):
    a worker killed while recording a measurement left part of one behind, which the retry must
    not pass for its own."""

    def __init__(self) -> None:
        with warnings.catch_warnings(action="ignore", category=optuna.exceptions.ExperimentalWarning):
            super().__init__(max_retry=MAX_RETRIES)

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        # A write of the retry's own attributes; what it keeps is read from the record like any key.
        kept = StudyTrial.of(trial).warm_start
        trial.user_attrs = {} if kept is None else {records.WARM_START: kept}
        with warnings.catch_warnings(action="ignore", category=optuna.exceptions.ExperimentalWarning):
            super().__call__(study, trial)


@dataclass(frozen=True)
class Worker:
    """This process as a worker of its study: every trial it runs records who and where, and
    beats in `storage` while it runs."""

    id: str
    host: str
    storage: StudyStorage | None = None
    # Seconds between looks at the study while other workers' trials hold the rest of the budget.
    poll_s: float = 2.0

    @classmethod
    def this_process(cls, storage: StudyStorage | None) -> Worker:
        host = socket.gethostname()
        return cls(f"{host}:{os.getpid()}:{uuid.uuid4().hex[:6]}", host, storage)


class Heartbeat:
    """Beats for one trial while the `with` block runs: once on entry (so the trial can be
    found stale from the start), then every interval from a daemon thread.

    A beat that fails (the server restarting) is retried at the next interval, logged when beats
    start and stop failing (not every interval of an outage): the trial is only lost when beats
    stop for the whole grace period.
    """

    def __init__(self, storage: StudyStorage, trial_id: int) -> None:
        self.storage = storage
        self.trial_id = trial_id
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def __enter__(self) -> Heartbeat:
        interval = self.storage.get_heartbeat_interval()
        if interval is None:
            return self
        self._beat()
        self._thread = threading.Thread(
            target=self._run, args=(interval,), name=f"heartbeat-{self.trial_id}", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self, interval: int) -> None:
        while not self._stop.wait(interval):
            self._beat()

    def _beat(self) -> None:
        try:
            self.storage.record_heartbeat(self.trial_id)
        except Exception as exc:
            if not self._failing:
                log.warning("trial heartbeat not recorded (%s); retrying every interval", type(exc).__name__)
            self._failing = True
        else:
            if self._failing:
                log.warning("trial heartbeat recorded again")
            self._failing = False


class RunningWatch:
    """When this worker first saw each running trial, by its own monotonic clock.

    A trial runs at most its trial timeout (the runner kills it then) plus the time to record it.
    One seen running much longer has a worker that is gone without ever beating (it died between
    asking for the trial and its first heartbeat, or its beats never reached the storage), which
    Optuna's stale check cannot see: it only judges trials that have a heartbeat. Timed here, not
    from the trial's start time, which is the asking host's local clock; the time this process
    spent unable to reach its storage (`outage.unreachable_total_s`) does not count, since no
    worker could record a trial then.
    """

    def __init__(self, overdue_s: float) -> None:
        self.overdue_s = overdue_s
        self._first_seen: dict[int, tuple[float, float]] = {}  # number: (when, outage seconds then)

    def overdue(self, running: list[FrozenTrial], now: float | None = None) -> list[FrozenTrial]:
        """The trials of `running` seen running for longer than `overdue_s`."""
        now = time.monotonic() if now is None else now
        down_s = outage.unreachable_total_s()
        numbers = {t.number for t in running}  # a watch follows one study: its trial numbers are unique
        self._first_seen = {n: seen for n, seen in self._first_seen.items() if n in numbers}
        for number in numbers:
            self._first_seen.setdefault(number, (now, down_s))

        def seen_for(number: int) -> float:
            when, down_then = self._first_seen[number]
            return now - when - (down_s - down_then)

        return [t for t in running if seen_for(t.number) > self.overdue_s]


def fail_lost_trials(
    study: optuna.Study, storage: StudyStorage, watch: RunningWatch | None = None
) -> list[FrozenTrial]:
    """Fail the study's RUNNING trials whose worker is gone, and queue their settings again: those
    with a stale heartbeat (Optuna's `fail_stale_trials` on an `RDBStorage`, the journal's
    `stale_trial_ids`), and with `watch`, those this worker has seen running for longer than any
    trial can (`RunningWatch`), with the same retry.

    The stale check runs at most once a heartbeat interval for a study (`_stale_check_due`).
    Returns the study's trials as they stand afterwards (`get_trials(deepcopy=False)`): the one
    read of the whole study that the loop needs each round (it is read again only when a trial
    was failed here)."""
    failed = False
    if _stale_check_due(study, storage):
        if isinstance(storage, JournalStudyStorage):
            for trial_id in storage.stale_trial_ids(storage.get_study_id_from_name(study.study_name)):
                failed = _fail_lost(study, storage, trial_id, "its heartbeat stopped") or failed
        else:
            with warnings.catch_warnings(action="ignore", category=optuna.exceptions.ExperimentalWarning):
                optuna.storages.fail_stale_trials(study)
    trials = study.get_trials(deepcopy=False)
    if watch is None:
        return study.get_trials(deepcopy=False) if failed else trials
    for trial in watch.overdue([t for t in trials if t.state == TrialState.RUNNING]):
        reason = f"it ran for over {watch.overdue_s:.0f} s"
        failed = _fail_lost(study, storage, trial_id_of(storage, study, trial.number), reason) or failed
    return study.get_trials(deepcopy=False) if failed else trials


def _fail_lost(study: optuna.Study, storage: StudyStorage, trial_id: int, reason: str) -> bool:
    """Fail trial `trial_id` as lost and queue its retry; False where it had finished already."""
    try:
        if not storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
            return False
    except optuna.exceptions.UpdateFinishedTrialError:
        return True  # another worker failed it first (and queued its retry)
    trial = copy.deepcopy(storage.get_trial(trial_id))
    log.warning("trial %d: its worker is gone (%s); failed as lost", trial.number, reason)
    callback = storage.get_heartbeat_stale_trial_callback()
    if callback is not None:
        callback(study, trial)
    return True


def _stale_check_due(study: optuna.Study, storage: StudyStorage) -> bool:
    """Whether the study's stale check is due, and if so, mark it done now. A trial goes stale
    only `grace_period` seconds (several beats) after its last beat, so checking more often than
    once a beat finds nothing more; the loop looked every round, two statements a trial."""
    now = time.monotonic()
    last = _stale_checked.get(study)
    if last is not None and now - last < (storage.get_heartbeat_interval() or 0):
        return False
    _stale_checked[study] = now
    return True


_stale_checked: weakref.WeakKeyDictionary[optuna.Study, float] = weakref.WeakKeyDictionary()


def trial_id_of(storage: optuna.storages.BaseStorage, study: optuna.Study, number: int) -> int:
    """The storage's id of trial `number` of `study` (what heartbeats and state changes name),
    through the storage's public interface: Optuna keeps the id on a trial only privately.

    The study's id is looked up once per `Study` object and storage (a `Study` is bound to one
    study id for its life); each trial's id is one query (on the journal, a read of what other
    workers appended since the last)."""
    known = _study_ids.get(study)
    if known is not None and known[0] is storage:
        study_id = known[1]
    else:
        study_id = storage.get_study_id_from_name(study.study_name)
        _study_ids[study] = (storage, study_id)
    return storage.get_trial_id_from_study_id_trial_number(study_id, number)


_study_ids: weakref.WeakKeyDictionary[optuna.Study, tuple[optuna.storages.BaseStorage, int]] = (
    weakref.WeakKeyDictionary()
)


def is_lost(trial: FrozenTrial) -> bool:
    """Whether `trial` was failed because its worker was lost. Every failure a worker records
    names its kind (`trial_attrs.record_failure`, "interrupted" on resume); a lost worker
    records none, even when it died halfway through recording a measurement."""
    return StudyTrial.of(trial).lost


__all__ = [
    "HEARTBEAT_INTERVAL_S",
    "Heartbeat",
    "Worker",
    "RetryLostTrial",
    "RunningWatch",
    "default_grace_period",
    "StudyStorage",
    "fail_lost_trials",
    "is_lost",
    "open_storage",
    "read_storage",
    "set_liveness",
    "trial_id_of",
]
