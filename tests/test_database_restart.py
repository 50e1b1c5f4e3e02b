"""A shared PostgreSQL study survives its server restarting (issue 39, item 1): two workers mid-trial,
the server restarted (`pg_ctl restart -m fast`), later stopped for 30 s and started again. The
worker with the default retry limit rides both out; the other, launched through the CLI with
`--storage-retry 12`, stops during the long outage with one line (exit status 1, no traceback)
and, relaunched with --resume, rejoins. The study measures its whole budget, every setting once,
no trial left RUNNING, and no trial lost but the one the stopped worker was running."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from conftest import FIXTURES, wait_until
from helpers.postgres_server import PASSWORD

from tpu_tuner.studies import records
from tpu_tuner.studies.liveness import is_lost, open_storage
from tpu_tuner.studies.run_file import RUN_FILE
from tpu_tuner.tuning.run.shared_study import VERIFICATION_ATTR

STUDY = "restarted-server"
TRIALS = 6  # every setting of fixtures/eager_precision_space.toml
OUTAGE_S = 30
RETRY_LIMIT_S = 12  # the CLI worker's --storage-retry: shorter than the outage


def _cli_worker(url: str, results: Path, log: Path, *where: str) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "tpu_tuner.cli",
        str(FIXTURES / "synthetic_speed.py"),
        *where,
        "--storage",
        url,
        "--storage-retry",
        str(RETRY_LIMIT_S),
        "--space",
        str(FIXTURES / "eager_precision_space.toml"),
        "--trials",
        str(TRIALS),
        "--time-budget",
        "none",
        "--cold",
        "--no-prune",
        "--trial-timeout",
        "120",
        "--device",
        "cpu",
        "--out",
        str(results),
    ]
    return subprocess.Popen(command, stdout=log.open("a"), stderr=subprocess.STDOUT, start_new_session=True)


def _trials(storage: optuna.storages.BaseStorage) -> list[optuna.trial.FrozenTrial]:
    try:
        return optuna.load_study(study_name=STUDY, storage=storage).get_trials(deepcopy=False)
    except KeyError:  # not created yet
        return []


def _running(storage: optuna.storages.BaseStorage, pid: int | None = None, since: float = 0.0) -> bool:
    """Whether a trial (of worker `pid`, started after `since`) has been running for over a second."""
    for trial in _trials(storage):
        worker = records.attrs(trial).get(records.WORKER)
        start = trial.datetime_start.timestamp() if trial.datetime_start else None
        if (
            trial.state == optuna.trial.TrialState.RUNNING
            and (pid is None or (isinstance(worker, str) and worker.split(":")[1] == str(pid)))
            and start is not None
            and start > since
            and time.time() - start > 1.0
        ):
            return True
    return False


def _finished(storage: optuna.storages.BaseStorage) -> int:
    return sum(t.state.is_finished() for t in _trials(storage))


@pytest.mark.slow  # two whole runs and a 30 s outage: .ci/run's full pass
@pytest.mark.timed  # a 30 s outage against a 12 s --storage-retry limit, the default limit riding it out
def test_workers_ride_out_a_server_restart_and_a_30_s_outage_losing_and_doubling_nothing(postgres, tmp_path) -> None:
    url = postgres.url("secret", PASSWORD)
    results = tmp_path / "results"
    storage = open_storage(url)
    riding_log, cli_log = tmp_path / "riding.log", tmp_path / "cli.log"
    riding = subprocess.Popen(
        [sys.executable, str(FIXTURES / "shared_study_worker.py"), STUDY, str(results), url]
        + ["--trials", str(TRIALS), "--timing-s", "5"],
        stdout=riding_log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    workers = [riding]
    try:
        wait_until(lambda: _trials(storage) or riding.poll() is not None, 120, riding_log.read_text)
        cli = _cli_worker(url, results, cli_log, "--study", STUDY)  # joins, adopting the study's options
        workers.append(cli)

        # A restart while trials run (the CLI worker's among them: it has joined).
        wait_until(lambda: _running(storage, cli.pid), 240, lambda: cli_log.read_text()[-2000:])
        complete_before = {t.number for t in _trials(storage) if t.state == optuna.trial.TrialState.COMPLETE}
        finished_before = _finished(storage)
        postgres.restart()
        back = time.monotonic()
        wait_until(lambda: _finished(storage) > finished_before, 120, lambda: riding_log.read_text()[-2000:])
        restart_to_progress_s = time.monotonic() - back
        stopped_at = time.time()

        # A 30 s outage while the CLI worker runs a trial: past its retry limit.
        wait_until(lambda: _running(storage, cli.pid, since=stopped_at - 60), 240, lambda: cli_log.read_text()[-2000:])
        finished_before = _finished(storage)
        postgres.stop()
        down = time.monotonic()
        assert cli.wait(timeout=OUTAGE_S + 30) == 1, cli_log.read_text()[-3000:]
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down)))  # the rest of the outage (the fault itself)
        postgres.start()
        back = time.monotonic()
        outage_s = back - down
        wait_until(lambda: _finished(storage) > finished_before, 120, lambda: riding_log.read_text()[-2000:])
        outage_to_progress_s = time.monotonic() - back

        # The stopped worker said why in one line, and resumes.
        said = cli_log.read_text()
        assert "Traceback" not in said and "storage unreachable: retrying" in said, said[-3000:]
        errors = [line for line in said.splitlines() if line.startswith("tpu-tune: error:")]
        assert len(errors) == 1 and said.rstrip().endswith(errors[0]), said[-3000:]
        assert re.search(
            rf"unreachable for {RETRY_LIMIT_S} s, the limit \(--storage-retry {RETRY_LIMIT_S}\)", errors[0]
        )
        assert PASSWORD not in said
        (run_dir,) = [p.parent for p in results.glob(f"*/{RUN_FILE}") if f'"pid": {cli.pid}' in p.read_text()]
        resumed = _cli_worker(url, results, cli_log, "--resume", str(run_dir))
        workers.append(resumed)
        assert riding.wait(timeout=300) == 0, riding_log.read_text()[-3000:]
        assert resumed.wait(timeout=300) == 0, cli_log.read_text()[-3000:]
    finally:
        for worker in workers:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)

    trials = optuna.load_study(study_name=STUDY, storage=open_storage(url)).get_trials(deepcopy=False)
    by_number = {t.number: t for t in trials}
    assert not [t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    assert all(by_number[n].state == optuna.trial.TrialState.COMPLETE for n in complete_before)
    measured = [t for t in trials if records.attrs(t).get("measured") and "repeat_of" not in records.attrs(t)]
    settings = [tuple(sorted(t.params.items())) for t in measured if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(settings) == TRIALS and len(set(settings)) == TRIALS, settings  # none lost, none doubled
    # Lost: at most the trial the stopped worker was running, measured again once.
    lost = [t for t in trials if is_lost(t)]
    assert len(lost) <= 1 and all(str(cli.pid) in records.attrs(t).get(records.WORKER, "") for t in lost), lost
    for trial in lost:
        retries = [t for t in trials if t.system_attrs.get("failed_trial") == trial.number]
        assert len(retries) == 1 and retries[0].state == optuna.trial.TrialState.COMPLETE
    assert optuna.load_study(study_name=STUDY, storage=open_storage(url)).user_attrs.get(VERIFICATION_ATTR)
    riding_said = riding_log.read_text()
    recovered = re.findall(r"storage reachable again after (\d+) s", riding_said + cli_log.read_text())
    print(
        f"\nrestart: progress {restart_to_progress_s:.1f} s after the server was back; "
        f"outage of {outage_s:.1f} s: progress {outage_to_progress_s:.1f} s after; ridden out (s): {recovered}; "
        f"lost {len(lost)}, doubled {len(settings) - len(set(settings))}, trials {len(trials)}"
    )
