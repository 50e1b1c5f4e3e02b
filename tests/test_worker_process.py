"""The one subprocess-worker primitive (`runner/worker_process.py`) that trial workers and the
planner's compile workers run on: a reply, a job's exception, a death by signal or exit status,
a timeout, each read as its own outcome; the child leaves no process behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import processes_running

from tpu_tuner.core.failures import describe_end
from tpu_tuner.runner.worker_process import Died, Raised, Replied, TimedOut, WorkerProcess

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")]))
    started = WorkerProcess("echo_worker", env={"ECHO_WORKER_MARK": "set"})
    yield started
    started.close(kill=True)
    assert processes_running("echo_worker") == []


def test_replies_and_a_jobs_exception_keep_the_worker(worker: WorkerProcess) -> None:
    assert worker.request(("echo", [1, "two"]), timeout_s=60) == Replied([1, "two"])
    assert worker.request(("env", "ECHO_WORKER_MARK"), timeout_s=10) == Replied("set")
    raised = worker.request(("raise", "bad input"), timeout_s=10)
    assert isinstance(raised, Raised) and (raised.kind, raised.message) == ("error", "ValueError: bad input")
    assert "Traceback" in raised.traceback
    oom = worker.request(("oom", None), timeout_s=10)
    assert isinstance(oom, Raised) and oom.kind == "oom"
    assert worker.alive() and worker.request(("echo", 3), timeout_s=10) == Replied(3)


@pytest.mark.parametrize(
    "job, code, words, kind",
    [
        (("signal", "SIGSEGV"), -11, "died from SIGSEGV", "crash"),
        (("signal", "SIGKILL"), -9, "died from SIGKILL (the kernel's OOM killer)", "oom"),
        (("exit", 3), 3, "exited with status 3", "crash"),
    ],
)
def test_a_death_is_decoded_from_the_exit_status(
    worker: WorkerProcess, job: tuple, code: int, words: str, kind: str
) -> None:
    died = worker.request(job, timeout_s=60)
    assert died == Died(code) and describe_end(died.exit_code) == words and died.kind == kind
    assert not worker.alive()


def test_a_job_past_its_timeout_kills_the_worker(worker: WorkerProcess) -> None:
    assert worker.request(("echo", "warm"), timeout_s=60) == Replied("warm")
    assert worker.request(("sleep", 30), timeout_s=0.5) == TimedOut(0.5)
    assert not worker.alive()


def test_close_asks_the_worker_to_exit(worker: WorkerProcess) -> None:
    assert worker.request(("echo", 1), timeout_s=60) == Replied(1)
    worker.close()
    assert worker.process.returncode == 0
