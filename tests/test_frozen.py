"""Frozen processes (issue 39 item 3): a trial worker and a rank that are stopped (SIGSTOP), not
dead, are found stopped within `FROZEN_GRACE_S`, killed, and their job failed as a HANG that the
study measures again; a stop shorter than the grace is left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import processes_running, wait_until

from tpu_tuner.core.failures import MEASURED_AGAIN, FailureKind
from tpu_tuner.runner import trial_runner
from tpu_tuner.runner.frozen import FROZEN_GRACE_S, Frozen, FrozenWatch, is_stopped
from tpu_tuner.runner.worker_process import Replied, WorkerProcess

FIXTURES = Path(__file__).parent / "fixtures"
# What the parent may add to the grace before it sees the stop: a look every LOOK_S, and a loaded host.
SLACK_S = 3.0


@pytest.fixture
def fixtures_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")]))


@pytest.fixture
def sleeper():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield process
    process.kill()
    process.wait()


def test_a_stop_is_read_from_proc_and_counts_only_past_the_grace(sleeper: subprocess.Popen) -> None:
    watch = FrozenWatch(grace_s=10.0)
    child = [(sleeper.pid, "the sleeper")]

    def looks(start: float, end: float) -> list[Frozen | None]:  # one look a second, as a waiting parent makes
        return [watch.look(child, now=start + second) for second in range(int(end - start) + 1)]

    assert not is_stopped(sleeper.pid)
    os.kill(sleeper.pid, signal.SIGSTOP)
    wait_until(lambda: is_stopped(sleeper.pid), 10)
    assert looks(100.0, 109.0) == [None] * 10  # stopped since 100: within the grace
    assert watch.look(child, now=110.0) == Frozen(sleeper.pid, "the sleeper", 10.0)
    os.kill(sleeper.pid, signal.SIGCONT)  # a pause on purpose, continued: the count starts again
    wait_until(lambda: not is_stopped(sleeper.pid), 10)
    assert watch.look(child, now=111.0) is None
    os.kill(sleeper.pid, signal.SIGSTOP)
    wait_until(lambda: is_stopped(sleeper.pid), 10)
    assert looks(112.0, 121.0) == [None] * 10
    # The next look 30 s after the last: the watcher was stopped itself (Ctrl-Z, then fg): the count restarts.
    assert looks(151.0, 160.0) == [None] * 10
    assert watch.look(child, now=161.0) == Frozen(sleeper.pid, "the sleeper", 10.0)
    assert Frozen(1, "rank 1", 5.2).describe() == "rank 1 (pid 1) froze: stopped (SIGSTOP) for 5 s, and was killed"
    assert not is_stopped(2**22 + 7)  # no such process


def test_a_frozen_worker_is_killed_within_the_grace_and_its_trial_fails_as_a_hang(
    fixtures_on_path: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trial runner's worker (the echo worker in its place) stops itself mid-job: the job fails
    as a HANG naming the worker and its pid long before the job's 300 s deadline, the stopped
    worker is killed, and the next job runs in a fresh worker."""
    monkeypatch.setattr(trial_runner, "WORKER_MODULE", "echo_worker")
    with trial_runner.TrialRunner("unused.py", timeout_s=300) as runner:
        assert runner.run(("echo", "warm")).value == "warm"  # type: ignore[arg-type]  # any picklable job
        assert runner._worker is not None
        pid = runner._worker.process.pid
        started = time.monotonic()
        result = runner.run(("stop", None))  # type: ignore[arg-type]  # any picklable job
        detected = time.monotonic() - started
        assert result.failure is not None and result.failure.kind == FailureKind.HANG
        assert result.failure.message.startswith(f"the worker (pid {pid}) froze: stopped (SIGSTOP) for ")
        assert FROZEN_GRACE_S <= detected < FROZEN_GRACE_S + SLACK_S, detected
        assert FailureKind.HANG in MEASURED_AGAIN  # the study fails it and queues its setting again
        assert not Path(f"/proc/{pid}").exists()  # killed and reaped
        assert runner.run(("echo", "again")).value == "again"  # type: ignore[arg-type]  # any picklable job
        assert runner.workers_started == 2
    assert processes_running("echo_worker") == []


def test_a_worker_stopped_briefly_and_continued_still_replies(fixtures_on_path: None) -> None:
    """A stop the grace allows (somebody pausing it to look) costs nothing: the job's reply comes."""
    worker = WorkerProcess("echo_worker")
    try:
        assert worker.send(("stop", "after the pause"))
        wait_until(lambda: is_stopped(worker.process.pid), 30)
        os.kill(worker.process.pid, signal.SIGCONT)
        assert worker.receive(60) == Replied("after the pause")
    finally:
        worker.close(kill=True)


@pytest.mark.slow  # two gloo ranks started by torch's launcher: about 10 s on 2 cores
@pytest.mark.timed  # found within 60 s + FROZEN_GRACE_S, not the 300 s deadline
def test_a_frozen_rank_fails_its_group_as_a_hang_naming_it_and_leaves_no_process(fixtures_on_path: None) -> None:
    from tpu_tuner.runner.launch import run_ranks

    started = time.monotonic()
    result = run_ranks(2, "misbehaving_rank", ["stop"], timeout_s=300)
    took = time.monotonic() - started
    assert not result.ok and result.kind == FailureKind.HANG and result.failed_rank == 1
    assert result.failure is not None and result.failure.startswith("rank 1 (pid ")
    assert "froze: stopped (SIGSTOP) for " in result.failure
    assert took < 60 + FROZEN_GRACE_S, took  # start-up and the grace, not the 300 s deadline
    assert processes_running("misbehaving_rank") == []


def test_a_hang_teaches_nothing_covers_no_setting_and_is_measured_again() -> None:
    import optuna

    from tpu_tuner.execution.measurement import TrialFailure
    from tpu_tuner.studies import records
    from tpu_tuner.studies.coverage import covered_settings
    from tpu_tuner.studies.trial_record import TrialRecord
    from tpu_tuner.tuning.search.failure_learning import evidence_of
    from tpu_tuner.tuning.search.trial_attrs import record_failure
    from tpu_tuner.tuning.search.tuning_trial import TuningTrial

    study = optuna.create_study()
    trial = study.ask({"layout": optuna.distributions.CategoricalDistribution(["2x1x1", "1x2x1"])})
    TrialRecord.of(trial).update({records.MEASURED: True})
    record_failure(trial, TrialFailure(FailureKind.HANG, "the worker (pid 7) froze: stopped (SIGSTOP) for 5 s"))
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    trials = study.get_trials()
    assert evidence_of(TuningTrial.all(trials), 1e-2) == [] and covered_settings(trials) == {}
