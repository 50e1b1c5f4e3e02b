"""The storage of a study on a PostgreSQL server: Optuna's `JournalStorage` on a journal of one
table, with heartbeats in a second one. Everything here is Optuna's and SQLAlchemy's public API.

Why a journal (RDBStorage's 26 transactions a trial, and no batched write in its public API):
docs/design.md, "Optuna's public API". `JournalStorage` replays the studies from a log and writes
each operation as one appended entry; its backend (`optuna.storages.journal.BaseJournalBackend`)
is two methods, made here on tables of the database (created on first use, beside any other):

* ``tpu_tune_journal(log_number, log)``: the entries, in order, as JSON text, numbered under a
  table lock so that a reader never skips one committed later under a lower number.
* ``tpu_tune_journal_appends(append_id, first_number)``: each append's id, so that one retried
  after a dropped connection is not added twice (docs/run-safety.md, "The database restarts").
* ``tpu_tune_heartbeats(trial_id, beat)``: a running trial's last beat, at the server's clock; no
  trial is stale until the server, and this worker's touch with it, have lasted the grace period
  (the same section).

Concurrency is the journal's: two workers popping one queued trial, or failing one lost trial,
both append, and every process's replay lets the first win (docs/many-workers.md, "Journal
storage: Optuna's public API only").
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import optuna
import sqlalchemy
from optuna.storages.journal import BaseJournalBackend, JournalStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.studies.outage import Outages

JOURNAL_TABLE = "tpu_tune_journal"
HEARTBEAT_TABLE = "tpu_tune_heartbeats"
APPENDS_TABLE = "tpu_tune_journal_appends"
# Optuna's RDBStorage table of studies: where tpu-tune kept a server study before the journal.
RDB_STUDIES_TABLE = "studies"
# The advisory lock under which the first worker creates the tables (any constant of our own).
_SCHEMA_LOCK = 0x7470757475

_SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS {JOURNAL_TABLE} (log_number BIGINT PRIMARY KEY, log TEXT NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS {HEARTBEAT_TABLE} (trial_id BIGINT PRIMARY KEY, beat TIMESTAMPTZ NOT NULL)",
    # An append numbers its entries under a lock held to its commit, so that numbers are committed
    # in order. EXCLUSIVE: other appends wait, reads do not. A VOLATILE function's INSERT takes its
    # snapshot after the lock (it sees the append before it); one call, one round trip.
    f"CREATE TABLE IF NOT EXISTS {APPENDS_TABLE} (append_id TEXT PRIMARY KEY, first_number BIGINT NOT NULL)",
    # An append already made under `id` (its commit's acknowledgement lost with a connection)
    # returns its first number again and adds nothing.
    f"""CREATE OR REPLACE FUNCTION {JOURNAL_TABLE}_append(entries TEXT[], id TEXT) RETURNS BIGINT LANGUAGE plpgsql AS $$
    DECLARE first BIGINT;
    BEGIN
        LOCK TABLE {JOURNAL_TABLE} IN EXCLUSIVE MODE;
        SELECT first_number INTO first FROM {APPENDS_TABLE} WHERE append_id = id;
        IF FOUND THEN
            RETURN first;
        END IF;
        SELECT COALESCE(MAX(log_number) + 1, 0) INTO first FROM {JOURNAL_TABLE};
        INSERT INTO {JOURNAL_TABLE} (log_number, log)
            SELECT first + entry.ordinal - 1, entry.log FROM unnest(entries) WITH ORDINALITY AS entry(log, ordinal);
        INSERT INTO {APPENDS_TABLE} (append_id, first_number) VALUES (id, first);
        RETURN first;
    END $$""",
)
_READ = sqlalchemy.text(f"SELECT log FROM {JOURNAL_TABLE} WHERE log_number >= :first ORDER BY log_number")
_APPEND = sqlalchemy.text(f"SELECT {JOURNAL_TABLE}_append(CAST(:logs AS TEXT[]), CAST(:id AS TEXT))")
_BEAT = sqlalchemy.text(
    f"INSERT INTO {HEARTBEAT_TABLE} (trial_id, beat) VALUES (:trial_id, now()) "
    "ON CONFLICT (trial_id) DO UPDATE SET beat = excluded.beat"
)
_STALE = sqlalchemy.text(
    f"SELECT trial_id FROM {HEARTBEAT_TABLE} "
    # The server's start counts as every trial's beat: one stopped or restarted heard no beats.
    "WHERE trial_id = ANY(:ids) AND GREATEST(beat, pg_postmaster_start_time()) < now() - make_interval(secs => :grace)"
)
_RDB_STUDY = sqlalchemy.text(f"SELECT 1 FROM {RDB_STUDIES_TABLE} WHERE study_name = :name")


def _scalars(engine: sqlalchemy.engine.Engine, statement: Any, parameters: dict[str, Any]) -> list[Any]:
    """The first column of what `statement` returns, run on a connection of its own."""
    with engine.connect() as connection:
        return list(connection.execute(statement, parameters).scalars())


class PostgresJournal(BaseJournalBackend):
    """Optuna's journal backend on the ``tpu_tune_journal`` table of `engine`'s database.

    Every statement is its own transaction (autocommit: no BEGIN or COMMIT round trip). A read
    that follows this process's own append, with nothing appended in between by others, is
    answered from that append (`JournalStorage` reads after every write it makes): one round trip
    a write, not two. The entries go through JSON either way, as another process reads them.
    Reads and appends ride out an unreachable server (`outages`); an append is retried under
    the id it drew, so it is applied once."""

    def __init__(self, engine: sqlalchemy.engine.Engine, outages: Outages | None = None) -> None:
        self.engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.outages = outages or Outages(engine.url.render_as_string(hide_password=True))
        self._appended: tuple[int, list[str]] | None = None  # (first number, entries) of the last append
        # Not retried: a worker that cannot reach its server at start is refused at once (exit 2,
        # tuning/run/run_location.py); an outage is ridden out only once the study is under way.
        self._create_schema(engine)

    @staticmethod
    def _create_schema(engine: sqlalchemy.engine.Engine) -> None:
        with engine.begin() as connection:
            # CREATE ... IF NOT EXISTS races with itself on PostgreSQL: one worker at a time.
            connection.execute(sqlalchemy.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK})
            for statement in _SCHEMA:
                connection.execute(sqlalchemy.text(statement))

    def read_logs(self, log_number_from: int) -> Iterable[dict[str, Any]]:
        appended, self._appended = self._appended, None
        if appended is not None and appended[0] == log_number_from:
            rows = appended[1]
        else:
            rows = self.outages.call(lambda: _scalars(self.engine, _READ, {"first": log_number_from}))
        return [json.loads(row) for row in rows]

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        entries = [json.dumps(entry) for entry in logs]
        append_id = uuid.uuid4().hex  # drawn once: every retry of this append sends it again

        def append() -> int:
            with self.engine.connect() as connection:
                return int(connection.execute(_APPEND, {"logs": entries, "id": append_id}).scalar_one())

        self._appended = (self.outages.call(append), entries)


class JournalStudyStorage(JournalStorage):
    """`JournalStorage` on a `PostgresJournal`, with the heartbeat interface `RDBStorage` has
    (`record_heartbeat`, `get_heartbeat_interval`, `get_heartbeat_stale_trial_callback`, the
    `heartbeat_interval` and `grace_period` a worker sets) and `stale_trial_ids`, which the
    liveness check calls (studies/liveness.py). `url` is what it was opened with, as
    `RDBStorage.url`; `engine` is the connection pool: the caller disposes of it."""

    def __init__(
        self,
        url: str,
        engine: sqlalchemy.engine.Engine,
        heartbeat_interval: int,
        grace_period: int,
        heartbeat_stale_trial_callback: Callable[[optuna.Study, FrozenTrial], None] | None,
        outages: Outages | None = None,
    ) -> None:
        self.url, self.engine = url, engine
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")  # no BEGIN, no COMMIT
        self.heartbeat_interval = heartbeat_interval
        self.grace_period = grace_period
        self.stale_trial_callback = heartbeat_stale_trial_callback
        self.outages = outages or Outages(engine.url.render_as_string(hide_password=True))
        super().__init__(PostgresJournal(engine, self.outages))

    def record_heartbeat(self, trial_id: int) -> None:
        """Record that `trial_id` is alive now (the server's clock)."""
        with self._autocommit.connect() as connection:
            connection.execute(_BEAT, {"trial_id": trial_id})

    def get_heartbeat_interval(self) -> int | None:
        """Seconds between a running trial's beats."""
        return self.heartbeat_interval

    def get_heartbeat_stale_trial_callback(self) -> Callable[[optuna.Study, FrozenTrial], None] | None:
        """What is called with a trial failed as stale (its retry)."""
        return self.stale_trial_callback

    def stale_trial_ids(self, study_id: int) -> list[int]:
        """The study's RUNNING trials whose last beat is older than the grace period (a trial that
        never beat is not judged here: `liveness.RunningWatch` is). None within the grace period
        after this worker rode out an outage: the other workers' beats failed as its calls did,
        and they have not all beaten since."""
        if self.outages.quiet_for() < self.grace_period:
            return []
        running = [
            self.get_trial_id_from_study_id_trial_number(study_id, t.number)
            for t in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))
        ]
        if not running:
            return []
        return self.outages.call(
            lambda: _scalars(self._autocommit, _STALE, {"ids": running, "grace": self.grace_period})
        )

    def create_new_study(self, directions: Sequence[StudyDirection], study_name: str | None = None) -> int:
        if study_name is not None:
            self._refuse_rdb_study(study_name)
        return super().create_new_study(directions, study_name)

    def get_study_id_from_name(self, study_name: str) -> int:
        try:
            return super().get_study_id_from_name(study_name)
        except KeyError:
            self._refuse_rdb_study(study_name)
            raise

    def _refuse_rdb_study(self, study_name: str) -> None:
        """A one-line error for a study that an earlier tpu-tune kept in Optuna's RDB tables of
        this database: the journal neither reads it nor must create a second study of its name."""
        if not sqlalchemy.inspect(self.engine).has_table(RDB_STUDIES_TABLE):
            return
        if _scalars(self.engine, _RDB_STUDY, {"name": study_name}):
            raise UserInputError(
                f"study {study_name!r} in {self.engine.url.render_as_string(hide_password=True)} is in Optuna's "
                "RDB tables (where tpu-tune kept server studies before its journal, docs/many-workers.md), which "
                "this version does not read: finish it with the earlier version, or name another study"
            )


__all__ = ["APPENDS_TABLE", "HEARTBEAT_TABLE", "JOURNAL_TABLE", "JournalStudyStorage", "PostgresJournal"]
