"""Studies on a real PostgreSQL server (Debian's package, started by the `postgres` fixture on a
loopback port): the storage a study of many workers shares (issue 15). The server is started
for real: a test here fails, never skips, where PostgreSQL is not installed."""

from __future__ import annotations

import json

import optuna
import pytest
from conftest import FIXTURES, FakeClock, wait_until
from helpers.postgres_server import PASSWORD

from tpu_tuner.api import tune
from tpu_tuner.profiling import ProfilerSettings
from tpu_tuner.studies import records
from tpu_tuner.studies.liveness import open_storage
from tpu_tuner.tuning.options.tune_options import (
    ObjectiveOptions,
    OutputOptions,
    RunnerOptions,
    SearchOptions,
    StoreOptions,
    TuneOptions,
)
from tpu_tuner.tuning.run.tuning_result import TuningResult

FAST = ProfilerSettings(
    warmup_min_steps=1,
    warmup_max_steps=5,
    timing_min_steps=10,
    timing_min_seconds=0.0,
    timing_max_steps=20,
    profiled_steps=1,
    top_operators=5,
    explained_share_min=0.5,
)


# Slow: a whole tuning run on the server (the quick run keeps its Optuna-tools and refusal tests). No
# clock (time_budget_s=None): its three trials are measured however loaded the host.
@pytest.mark.slow
def test_a_study_runs_on_the_server_and_its_run_folder_never_holds_the_password(postgres, tmp_path) -> None:
    url = postgres.url("secret", PASSWORD)
    # Every trial measured to the end (no pruning): the test reads three complete trials back.
    options = TuneOptions(
        search=SearchOptions(
            trials=3,
            sampler="grid",
            agents=(),
            prune=False,
            space=FIXTURES / "eager_precision_space.toml",
            time_budget_s=None,
        ),
        objective=ObjectiveOptions(verify_rounds=2),
        store=StoreOptions(url=url),
        outputs=OutputOptions(out=tmp_path),
        runner=RunnerOptions(trial_timeout_s=60.0, trial_settings=FAST),
    )
    result = tune(FIXTURES / "tiny_mlp_benchmark.py", options)
    # The trials are on the server: a fresh connection reads them back by the study's name.
    # The server study is a journal (studies/journal.py): read through tpu-tune's storage.
    stored = optuna.load_study(study_name=result.study.study_name, storage=open_storage(url))
    measured = [t for t in stored.trials if records.attrs(t).get("measured") and "repeat_of" not in records.attrs(t)]
    assert len(measured) == 3 and all(t.state == optuna.trial.TrialState.COMPLETE for t in measured)
    # Nothing the run wrote holds the password (the URL is kept without it).
    for path in result.run_dir.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".md", ".toml", ".csv", ".html", ".log"):
            assert PASSWORD not in path.read_text(errors="replace"), path
    run = json.loads((result.run_dir / "run.json").read_text())
    assert run["storage"] == postgres.url("secret")
    # Loading the run again needs the password from the environment (libpq's PGPASSWORD).
    reloaded_env = {"PGPASSWORD": PASSWORD}
    import os

    old = {k: os.environ.get(k) for k in reloaded_env}
    os.environ.update(reloaded_env)
    try:
        loaded = TuningResult.load(result.run_dir)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert len(loaded.study.trials) == len(stored.trials)


def test_the_server_refuses_a_wrong_password_in_one_line_without_it(postgres, tmp_path, capsys) -> None:
    from tpu_tuner.cli import main

    wrong = "not-the-password"
    status = main(
        [
            "-q",
            str(FIXTURES / "tiny_mlp_benchmark.py"),
            "--trials",
            "1",
            "--out",
            str(tmp_path),
            "--storage",
            postgres.url("secret", wrong),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and wrong not in err[0] and "password" in err[0].lower()


def test_a_connection_is_checked_only_after_idling_and_one_the_server_closed_is_replaced(postgres, monkeypatch) -> None:
    """Back-to-back storage calls (a trial's ~26 transactions) cost no check each; a connection
    idle past `PING_IDLE_S` is checked first, and one the server closed meanwhile is replaced
    without an error reaching the caller."""
    import uuid

    import psycopg

    from tpu_tuner.studies import liveness

    clock = FakeClock()
    monkeypatch.setattr(liveness, "time", clock)
    url = postgres.url("secret", PASSWORD)  # the role that owns the tables the other tests made
    storage = liveness.open_storage(url, 1)
    pings: list[int] = []
    ping = storage.engine.dialect.do_ping
    monkeypatch.setattr(storage.engine.dialect, "do_ping", lambda connection: pings.append(1) or ping(connection))
    name = f"ping-{uuid.uuid4().hex[:8]}"
    study_id = optuna.create_study(storage=storage, study_name=name)._study_id
    for _ in range(5):
        assert storage.get_study_id_from_name(name) == study_id
    assert pings == []
    # The server ends every session of the role but this one (a restart, an idle timeout).
    others = "FROM pg_stat_activity WHERE usename = 'secret' AND pid <> pg_backend_pid()"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"SELECT pg_terminate_backend(pid) {others}")
        wait_until(lambda: admin.execute(f"SELECT count(*) {others}").fetchone() == (0,), 30, lambda: "sessions ended")
    clock.now += liveness.PING_IDLE_S + 0.01  # idle past the limit
    assert storage.get_study_id_from_name(name) == study_id
    assert pings == [1]
    storage.engine.dispose()
