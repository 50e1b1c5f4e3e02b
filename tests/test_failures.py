"""The failure vocabulary (`core/failures.py`): the kinds keep the strings stored before, one
classifier reads a death's exit status or signal and an exception's text, and a trial worker's
failures, a rank's and a host's come out in those kinds."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tpu_tuner.core.failures import FailureKind, classify, describe_end, device_out_of_memory_line, failure_line
from tpu_tuner.execution.measurement import TrialFailure
from tpu_tuner.runner import trial_runner
from tpu_tuner.runner.host_jobs import HostOutcome
from tpu_tuner.runner.multi_host import host_cause
from tpu_tuner.runner.trial_runner import TrialRunner

FIXTURES = Path(__file__).parent / "fixtures"


def test_the_kinds_keep_the_strings_studies_already_store() -> None:
    # Every kind a study, trials.csv or a rank's JSON holds from earlier versions reads back as its kind.
    stored = ["error", "crash", "oom", "timeout", "accuracy", "refused", "memory", "interrupted"]
    assert [FailureKind(value) for value in stored] == stored
    assert json.loads(json.dumps({"failure_kind": FailureKind.OOM})) == {"failure_kind": "oom"}
    assert TrialFailure("crash", "read back").kind is FailureKind.CRASH
    with pytest.raises(ValueError):
        TrialFailure("segfault", "not a kind")


@pytest.mark.parametrize(
    "exit_code, kind, words",
    [
        (-signal.SIGKILL, FailureKind.OOM, "died from SIGKILL (the kernel's OOM killer)"),
        (-signal.SIGSEGV, FailureKind.CRASH, "died from SIGSEGV"),
        (-signal.SIGABRT, FailureKind.CRASH, "died from SIGABRT"),
        (-signal.SIGFPE, FailureKind.CRASH, "died from SIGFPE"),
        # Ended from outside its job (tpu-tune sends a worker neither): a crash, as before.
        (-signal.SIGTERM, FailureKind.CRASH, "died from SIGTERM"),
        (-signal.SIGINT, FailureKind.CRASH, "died from SIGINT"),
        (-99, FailureKind.CRASH, "died from signal 99"),
        (3, FailureKind.CRASH, "exited with status 3"),
        (0, FailureKind.CRASH, "exited with status 0"),  # ended without replying to its job
    ],
)
def test_a_death_is_classified_from_its_exit_status(exit_code: int, kind: FailureKind, words: str) -> None:
    assert classify(exit_code, died=True) is kind and classify(exit_code) is kind
    assert describe_end(exit_code) == words


def test_an_exit_is_an_error_where_the_process_exits_when_its_job_raises() -> None:
    # A rank exits with status 1 when its job raises; a signal still reads as a signal.
    assert classify(1, exit_is_error=True) is FailureKind.ERROR
    assert classify(-signal.SIGKILL, exit_is_error=True) is FailureKind.OOM
    assert classify(-signal.SIGSEGV, exit_is_error=True) is FailureKind.CRASH


def test_a_process_that_never_exited_is_a_crash() -> None:
    assert classify(None, died=True) is FailureKind.CRASH
    assert describe_end(None) == "did not exit, and was killed"


@pytest.mark.parametrize(
    "message, kind",
    [
        ("MemoryError: cannot allocate", FailureKind.OOM),
        ("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", FailureKind.OOM),
        ("OSError: [Errno 12] Cannot allocate memory", FailureKind.OOM),
        ("RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes", FailureKind.OOM),
        ("ValueError: bad input", FailureKind.ERROR),
        ("RuntimeError: memory format channels_last is not supported", FailureKind.ERROR),
    ],
)
def test_an_exception_is_classified_from_its_text(message: str, kind: FailureKind) -> None:
    assert classify(message=message) is kind


def test_a_compilers_failure_keeps_the_error_its_first_line_announces() -> None:
    """dynamo wraps a backend's error in a first line that only says "backend=... raised:"; the
    failure's line must carry the compiler's own error (the chip kept nothing else of one)."""
    import torch

    def refusing_backend(graph, example_inputs):
        raise ValueError("block_kv must be a multiple of 128")

    with pytest.raises(Exception) as raised:
        torch.compile(lambda x: x.sin() + 1, backend=refusing_backend)(torch.ones(3))
    line = failure_line(raised.value)
    assert line.startswith("BackendCompilerFailed: backend='refusing_backend' raised:")
    assert line.endswith("ValueError: block_kv must be a multiple of 128")


def test_a_wrapper_with_no_second_line_names_its_cause() -> None:
    try:
        try:
            raise KeyError("splash_sdpa")
        except KeyError as inner:
            raise RuntimeError("the kernel raised:") from inner
    except RuntimeError as outer:
        assert failure_line(outer) == "RuntimeError: the kernel raised: KeyError: 'splash_sdpa'"
    assert failure_line(ValueError("one\ntwo")) == "ValueError: one"
    assert len(failure_line(ValueError("x" * 900))) == 500


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A TrialRunner whose worker is the echo worker (its jobs: raise, oom, signal, sleep)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setattr(trial_runner, "WORKER_MODULE", "echo_worker")
    with TrialRunner(str(tmp_path / "unused.py"), timeout_s=60) as started:
        yield started


@pytest.mark.parametrize(
    "job, kind, message",
    [
        (("raise", "bad input"), FailureKind.ERROR, "ValueError: bad input"),
        (("oom", None), FailureKind.OOM, "MemoryError: cannot allocate"),
        (("signal", "SIGKILL"), FailureKind.OOM, "worker died from SIGKILL (the kernel's OOM killer)"),
        (("signal", "SIGSEGV"), FailureKind.CRASH, "worker died from SIGSEGV"),
        (("sleep", 30), FailureKind.TIMEOUT, "no result after 1 s; worker killed"),
    ],
)
def test_a_trial_workers_failures_come_out_in_the_vocabulary(
    runner: TrialRunner, job: tuple, kind: FailureKind, message: str
) -> None:
    timeout_s = 1 if kind is FailureKind.TIMEOUT else 60  # the others' worker may take seconds to start
    result = runner.run(job, timeout_s=timeout_s)  # type: ignore[arg-type]  # the echo worker's jobs are tuples
    assert result.failure is not None and result.failure.kind is kind
    assert result.failure.message.startswith(message)


def test_a_job_whose_device_log_says_it_ran_out_is_out_of_memory_and_its_worker_replaced(runner: TrialRunner) -> None:
    """torch-tpu raises "a required argument is in a failed state" where libtpu logged (to stderr
    only) that a buffer did not fit: the device's line makes it an OOM, and the next job starts a
    fresh worker (a device that ran out may be left unusable)."""
    result = runner.run(("device_oom", None))  # type: ignore[arg-type]  # the echo worker's jobs are tuples
    assert result.failure is not None and result.failure.kind is FailureKind.OOM
    assert result.failure.message.startswith("RuntimeError: a required argument is in a failed state")
    assert "(the device: [MaterializationWorker] ExecutionTask failed: RESOURCE_EXHAUSTED" in result.failure.message
    started = runner.workers_started
    assert runner.run(("echo", 1)).value == 1  # type: ignore[arg-type]
    assert runner.workers_started == started + 1
    # A plain error keeps its worker warm, and its kind.
    assert runner.run(("raise", "bad")).failure.kind is FailureKind.ERROR  # type: ignore[arg-type, union-attr]
    assert runner.run(("echo", 2)).value == 2 and runner.workers_started == started + 1  # type: ignore[arg-type]


def test_the_device_out_of_memory_line_is_found_in_a_workers_output() -> None:
    output = (
        "I0000 00:00:1 libtpu_version.cc:63] Setting libtpu version to: 0.0.52\n"
        "E0000 00:00:1796686155.70 4411 tpu_compiler.cc:12] CompileTimeHbmOom: Ran out of memory on HBM, the total "
        "memory required for HLO temporaries (16.68G) exceeds available HBM (15.75G).\n"
    )
    assert device_out_of_memory_line(output) == (
        "CompileTimeHbmOom: Ran out of memory on HBM, the total memory required for HLO temporaries (16.68G) "
        "exceeds available HBM (15.75G)."
    )
    assert device_out_of_memory_line("a compiler warning about memory layouts\n") is None


def _host(
    node: int,
    kind: FailureKind | None,
    failure: str = "",
    failed_rank: int | None = None,
    accounts: dict[int, dict[str, str]] | None = None,
) -> HostOutcome:
    return HostOutcome(
        node,
        "ab"[node],
        ok=kind is None,
        kind=kind,
        failure=failure or None,
        failed_rank=failed_rank,
        accounts=accounts or {},
    )


PEER = {"kind": "error", "message": "RuntimeError: Connection closed by peer"}


@pytest.mark.parametrize(
    "outcomes, kind, message",
    [
        # A rank's own account of its error beats its peers' echoes and the launcher's account.
        (
            [
                _host(0, FailureKind.ERROR, "rank 0 exited with status 1", 0, {0: PEER}),
                _host(
                    1,
                    FailureKind.ERROR,
                    "rank 2 exited with status 1",
                    2,
                    {2: {"kind": "oom", "message": "out of memory"}},
                ),
            ],
            FailureKind.OOM,
            "rank 2 (node 1, b): out of memory",
        ),
        # No account: a signal before a hang, named with its host.
        (
            [
                _host(0, FailureKind.TIMEOUT, "no rank finished within 8 s (a hang)"),
                _host(1, FailureKind.CRASH, "rank 3 died from SIGSEGV", 3),
            ],
            FailureKind.CRASH,
            "rank 3 died from SIGSEGV (node 1, b)",
        ),
        # Only echoes: the account of the rank the launcher saw exit with an error.
        (
            [
                _host(0, FailureKind.ABORTED, "the ranks of b failed"),
                _host(1, FailureKind.ERROR, "rank 3 exited with status 1", 3, {3: PEER}),
            ],
            FailureKind.ERROR,
            "rank 3 (node 1, b): RuntimeError: Connection closed by peer",
        ),
        # Every host's ranks were stopped from outside: an error naming what stopped them.
        (
            [_host(0, None), _host(1, FailureKind.ABORTED, "the driver went away")],
            FailureKind.ERROR,
            "the driver went away (node 1, b)",
        ),
    ],
)
def test_the_cause_of_a_failed_job_over_hosts_is_decided_once(
    outcomes: list[HostOutcome], kind: FailureKind, message: str
) -> None:
    failure = host_cause({outcome.node: outcome for outcome in outcomes})
    assert (failure.kind, failure.message) == (kind, message)


def test_a_raised_jobs_traceback_is_in_the_workers_log(runner: TrialRunner) -> None:
    """The report keeps a failure's first line; its whole traceback is in workers.log (a chip
    trial's CheckpointError was cut to the line that names no tensor)."""
    result = runner.run(("raise", "bad input"))  # type: ignore[arg-type]  # the echo worker's jobs are tuples
    assert result.failure is not None
    written = runner.log.tail()
    assert "the job failed in the worker (error)" in written and "Traceback" in written, written
    assert "ValueError: bad input" in written.split("the job failed in the worker")[1]
