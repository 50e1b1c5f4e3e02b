"""A frozen shared-study worker (issue 39 item 3): two workers share one study (SQLite, WAL); one is
stopped (SIGSTOP) in the middle of a trial. Its heartbeats stop, so the other fails the trial as
lost within the grace period (4 s here: fixtures/shared_study_worker.py) and measures its setting
again; when the frozen worker is continued (SIGCONT) it reads the trial's state before telling
(studies/loop.py) and drops its result: every setting is measured once, nothing is left RUNNING."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from conftest import FIXTURES, wait_until

from tpu_tuner.studies import records
from tpu_tuner.studies.liveness import is_lost, open_storage

STUDY = "frozen-shared"
GRACE_S = 4  # fixtures/shared_study_worker.py: heartbeat_interval_s=1, grace_period_s=4


def _pid_of(trial: optuna.trial.FrozenTrial) -> int | None:
    worker = records.attrs(trial).get("worker")
    return int(worker.split(":")[1]) if isinstance(worker, str) else None


@pytest.mark.slow  # two workers tune a study end to end: about a minute on 2 cores
@pytest.mark.timed  # the 4 s heartbeat grace, measured from the SIGSTOP
def test_a_frozen_worker_s_trial_is_failed_and_retried_and_it_drops_its_result_when_continued(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    workers = []
    for index in range(2):
        with (tmp_path / f"worker{index}.log").open("w") as log:
            workers.append(
                subprocess.Popen(
                    [sys.executable, str(FIXTURES / "shared_study_worker.py"), STUDY, str(tmp_path / "results"), url],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    by_pid = {w.pid: w for w in workers}
    storage = open_storage(url)
    frozen: list[tuple[int, int, float]] = []  # (worker pid, trial number, when it was stopped)

    def stop_one_mid_trial() -> bool:
        try:
            trials = optuna.load_study(study_name=STUDY, storage=storage).get_trials(deepcopy=False)
        except KeyError:  # not created yet
            return False
        for trial in trials:
            if trial.state == optuna.trial.TrialState.RUNNING and _pid_of(trial) in by_pid and trial.datetime_start:
                if time.time() - trial.datetime_start.timestamp() > 0.8:
                    os.kill(by_pid[_pid_of(trial)].pid, signal.SIGSTOP)  # the worker, not its trial process
                    frozen.append((by_pid[_pid_of(trial)].pid, trial.number, time.monotonic()))
                    return True
        return False

    def logs() -> str:
        return "\n".join(p.read_text() for p in sorted(tmp_path.glob("worker*.log")))

    try:
        wait_until(stop_one_mid_trial, 240, logs)
        pid, number, stopped_at = frozen[0]

        def failed_and_retried() -> bool:
            trials = optuna.load_study(study_name=STUDY, storage=storage).get_trials(deepcopy=False)
            return trials[number].state == optuna.trial.TrialState.FAIL and any(
                t.system_attrs.get("failed_trial") == number for t in trials
            )

        wait_until(failed_and_retried, 120, logs)
        detected = time.monotonic() - stopped_at
        print(f"frozen worker's trial failed and queued again {detected:.1f} s after SIGSTOP (grace {GRACE_S} s)")
        os.kill(pid, signal.SIGCONT)
        codes = {w.pid: w.wait(timeout=300) for w in workers}
    finally:
        for w in workers:
            if w.poll() is None:
                os.killpg(w.pid, signal.SIGKILL)
                w.wait()
    assert all(code == 0 for code in codes.values()), (codes, logs()[-3000:])
    # The grace counts from the last beat (up to an interval, 1 s, before the stop); the other worker
    # looks between its own trials.
    assert GRACE_S - 1 <= detected < GRACE_S + 10, detected
    trials = optuna.load_study(study_name=STUDY, storage=storage).get_trials(deepcopy=False)
    lost = trials[number]
    assert is_lost(lost) and records.MEASURED not in records.attrs(lost), records.attrs(lost)  # no second result
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == number]
    assert len(retries) == 1 and retries[0].state == optuna.trial.TrialState.COMPLETE
    assert (
        f"trial {number} was failed as lost by another worker while it ran here"
        in Path(tmp_path / f"worker{[w.pid for w in workers].index(pid)}.log").read_text()
    )
    measured = [
        t
        for t in trials
        if t.state == optuna.trial.TrialState.COMPLETE
        and records.attrs(t).get(records.MEASURED)
        and records.REPEAT_OF not in records.attrs(t)
    ]
    settings = [tuple(sorted(t.params.items())) for t in measured]
    assert len(settings) == len(set(settings)), settings  # no setting measured twice
    assert not any(t.state == optuna.trial.TrialState.RUNNING for t in trials)
