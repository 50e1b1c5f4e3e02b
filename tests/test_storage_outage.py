"""Riding out an unreachable study server (studies/outage.py, studies/journal.py): a call is retried
with a growing pause and a progress line, and given up past the limit in one line; the journal's
append is retried under one id, so an append whose commit outcome was lost is applied once (a fake
connection, then the real server's function); no trial is judged lost for a heartbeat gap an
outage made; `RunningWatch` does not count the outage."""

from __future__ import annotations

import json
import logging
import time
import uuid
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
import sqlalchemy
from conftest import wait_until
from helpers.postgres_server import PASSWORD

from tpu_tuner.studies import outage
from tpu_tuner.studies.journal import APPENDS_TABLE, HEARTBEAT_TABLE, JOURNAL_TABLE, PostgresJournal
from tpu_tuner.studies.liveness import Heartbeat, RunningWatch, fail_lost_trials, open_storage
from tpu_tuner.studies.outage import Outages, StorageUnreachable

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _refused() -> sqlalchemy.exc.OperationalError:
    return sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("connection refused"))


class FakeClock:
    """`time.monotonic` and `time.sleep` of a test: sleeping moves the clock."""

    def __init__(self) -> None:
        self.now, self.pauses = 100.0, []

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def _outages(clock: FakeClock, limit_s: float = 60) -> Outages:
    return Outages("postgresql://tune@db/tune", limit_s, clock=lambda: clock.now, sleep=clock.sleep)


def test_a_call_is_retried_with_a_growing_pause_and_a_progress_line_until_the_server_answers(caplog) -> None:
    clock, failures = FakeClock(), iter([_refused()] * 6)
    total_before = outage.unreachable_total_s()

    def attempt() -> str:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return "rows"

    retried = _outages(clock)
    with caplog.at_level(logging.WARNING, logger="tpu_tuner.studies.outage"):
        assert retried.call(attempt) == "rows"
    assert clock.pauses == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "storage unreachable: retrying, 0 s (OperationalError: (builtins.Exception) connection refused)"
    assert [line.split(",")[1].split("(")[0].strip() for line in lines[:6]] == [
        "0 s",
        "0 s",
        "2 s",
        "4 s",
        "8 s",
        "12 s",
    ]
    assert lines[-1] == "storage reachable again after 18 s"
    assert retried.quiet_for() == 0 and outage.unreachable_total_s() - total_before == pytest.approx(17.5)


def test_past_the_limit_the_worker_stops_in_one_line_and_a_wrong_statement_is_not_retried() -> None:
    clock = FakeClock()

    def down() -> None:
        raise _refused()

    with pytest.raises(StorageUnreachable) as stopped:
        _outages(clock, limit_s=20).call(down)
    message = str(stopped.value)
    assert "\n" not in message and stopped.value.exit_status == 1
    assert message.startswith("the study storage postgresql://tune@db/tune was unreachable for 20 s, the limit")
    assert "--storage-retry 20" in message and "relaunch it" in message
    assert sum(clock.pauses) == 20  # the last pause ends at the limit

    def wrong() -> None:
        raise sqlalchemy.exc.ProgrammingError("SELECT nope", {}, Exception("syntax error"))

    with pytest.raises(sqlalchemy.exc.ProgrammingError):
        _outages(FakeClock()).call(wrong)


class FakeServer:
    """The journal's append function as the server runs it, behind a connection that drops after
    the server committed (the client never hears the outcome) as often as `drops` says."""

    def __init__(self, drops: int) -> None:
        self.rows: list[str] = []
        self.appends: dict[str, int] = {}
        self.ids_sent: list[str] = []
        self.drops = drops

    def execute(self, statement: Any, parameters: dict[str, Any] | None = None) -> Any:
        if parameters is None or "key" in parameters:
            return None  # the schema's statements
        if "logs" not in parameters:
            return SimpleNamespace(scalars=lambda: list(self.rows[parameters["first"] :]))
        self.ids_sent.append(parameters["id"])
        first = self.appends.get(parameters["id"])
        if first is None:
            first = self.appends[parameters["id"]] = len(self.rows)
            self.rows.extend(parameters["logs"])
        if self.drops:
            self.drops -= 1
            raise _refused()
        return SimpleNamespace(scalar_one=lambda: first)


class FakeEngine:
    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self.url = sqlalchemy.engine.make_url("postgresql://tune@db/tune")

    def execution_options(self, **options: Any) -> FakeEngine:
        return self

    def connect(self) -> Any:
        server = self.server

        class Connection:
            def __enter__(self) -> FakeServer:
                return server

            def __exit__(self, *exc: object) -> None:
                pass

        return Connection()

    begin = connect


def test_an_append_whose_commit_was_lost_with_its_connection_is_retried_under_its_id_and_applied_once() -> None:
    server = FakeServer(drops=2)
    journal = PostgresJournal(FakeEngine(server), _outages(FakeClock()))  # type: ignore[arg-type]  # a fake engine
    journal.append_logs([{"op_code": 0, "n": 1}, {"op_code": 4, "n": 2}])
    assert len(server.ids_sent) == 3 and len(set(server.ids_sent)) == 1  # one id, sent on every try
    assert server.rows == ['{"op_code": 0, "n": 1}', '{"op_code": 4, "n": 2}']
    journal.append_logs([{"op_code": 5}])  # the next append draws a new id
    assert len(set(server.ids_sent)) == 2 and len(server.rows) == 3
    assert list(journal.read_logs(2)) == [{"op_code": 5}]  # answered from the append: no round trip
    assert list(journal.read_logs(0))[0] == {"op_code": 0, "n": 1}


@pytest.fixture
def url(postgres: Any) -> str:
    return str(postgres.url("secret", PASSWORD))


def test_the_servers_append_function_applies_an_append_id_once(url) -> None:
    engine = sqlalchemy.create_engine(url, isolation_level="AUTOCOMMIT")
    PostgresJournal(engine)  # the tables and the function
    # Entries every replay of this shared database can apply: two new studies.
    append_id, names = uuid.uuid4().hex, [f"append-once-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    entries = [json.dumps({"op_code": 0, "worker_id": "test", "study_name": n, "directions": [1]}) for n in names]
    statement = sqlalchemy.text(f"SELECT {JOURNAL_TABLE}_append(CAST(:logs AS TEXT[]), :id)")
    with engine.connect() as connection:
        first = connection.execute(statement, {"logs": entries, "id": append_id}).scalar_one()
        again = connection.execute(statement, {"logs": entries, "id": append_id}).scalar_one()
        found = connection.execute(
            sqlalchemy.text(f"SELECT log_number FROM {JOURNAL_TABLE} WHERE log = ANY(:logs) ORDER BY 1"),
            {"logs": entries},
        ).scalars()
        recorded = connection.execute(
            sqlalchemy.text(f"SELECT first_number FROM {APPENDS_TABLE} WHERE append_id = :id"), {"id": append_id}
        ).scalar_one()
    assert again == first == recorded and list(found) == [first, first + 1]
    engine.dispose()


def _server_up_for(storage: Any, seconds: float) -> bool:
    with storage.engine.connect() as connection:
        up = connection.execute(sqlalchemy.text("SELECT extract(epoch FROM now() - pg_postmaster_start_time())"))
        return float(up.scalar_one()) > seconds


def test_a_heartbeat_gap_an_outage_made_is_no_lost_trial(url) -> None:
    """A trial whose last beat is past the grace period is not failed by a worker that came back
    from an outage less than a grace period ago (the trial's worker could not beat either)."""
    name = f"outage-{uuid.uuid4().hex[:8]}"
    storage = open_storage(url, 1, 2)
    wait_until(lambda: _server_up_for(storage, 2), 30)  # the server's start counts as a beat
    study = optuna.create_study(storage=storage, study_name=name)
    trial = study.ask()
    trial.suggest_float("x", 0, 1)
    trial_id = storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(name), trial.number)
    with Heartbeat(storage, trial_id):
        pass
    with storage.engine.connect() as connection:
        connection.execute(
            sqlalchemy.text(f"UPDATE {HEARTBEAT_TABLE} SET beat = beat - interval '3 seconds' WHERE trial_id = :id"),
            {"id": trial_id},
        )
        connection.commit()
    other = open_storage(url, 1, 2)
    other.outages.recovered_at = time.monotonic()  # this worker was cut off until a moment ago
    trials = fail_lost_trials(optuna.load_study(study_name=name, storage=other), other)
    assert trials[trial.number].state == optuna.trial.TrialState.RUNNING
    other.outages.recovered_at = time.monotonic() - 2.5  # back for longer than the grace period
    assert other.stale_trial_ids(other.get_study_id_from_name(name)) == [trial_id]


def test_running_watch_does_not_count_the_time_the_storage_was_unreachable(monkeypatch) -> None:
    down = {"s": 50.0}
    monkeypatch.setattr(outage, "unreachable_total_s", lambda: down["s"])
    watch = RunningWatch(overdue_s=100)
    trial = optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING)
    assert watch.overdue([trial], now=0.0) == []
    down["s"] = 90.0  # a 40 s outage while it ran
    assert watch.overdue([trial], now=130.0) == []  # 130 s seen, 90 s of it reachable
    assert watch.overdue([trial], now=141.0) == [trial]


def test_the_retry_limit_is_an_option_checked_with_the_others() -> None:
    from tpu_tuner.core.errors import UserInputError
    from tpu_tuner.tuning.options.tune_options import StoreOptions

    assert StoreOptions().storage_retry_s == outage.DEFAULT_LIMIT_S == 300
    assert StoreOptions(storage_retry_s=0).storage_retry_s == 0  # no retry: stop at the first failure
    with pytest.raises(UserInputError, match="--storage-retry must be 0 or more seconds, not -1"):
        StoreOptions(storage_retry_s=-1)
