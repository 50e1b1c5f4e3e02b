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


def _gone(pid: int, within_s: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().split(") ")[1].startswith("Z"):  # killed, not yet reaped by its parent
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_a_worker_killed_at_its_timeout_takes_what_it_started_with_it(worker: WorkerProcess) -> None:
    """Issue 68: a worker stopped by the clock is killed with its process group, not alone."""
    helper = worker.request(("spawn", 600), timeout_s=30)
    assert isinstance(helper, Replied)
    assert isinstance(worker.request(("sleep", 60), timeout_s=0.5), TimedOut)
    assert _gone(int(helper.value))


def test_a_worker_dies_with_its_parent(tmp_path: Path) -> None:
    """The worker leads a session of its own (no terminal signal reaches it), so a parent that dies
    without closing it must not leave it holding the device."""
    import subprocess
    import sys

    script = (
        "import os, sys\n"
        "from tpu_tuner.runner.worker_process import WorkerProcess, Replied\n"
        "w = WorkerProcess('echo_worker')\n"
        "assert w.request(('echo', 1), timeout_s=60) == Replied(1)\n"
        "assert w.send(('sleep', 600))\n"  # busy: a closed pipe alone would not end it
        "print(w.process.pid, flush=True)\n"
        "os._exit(0)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert _gone(int(done.stdout.split()[-1]))
