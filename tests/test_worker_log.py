"""The workers' output kept off the terminal (runner/worker_log.py, issue 26): what a worker
writes to its file descriptors 1 and 2 lands in the log, never on the parent's terminal; a log
started before the run folder exists moves into it with what it holds; a death's message quotes
the log's telling line and where the log is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import FIXTURES

from tpu_tuner.core.errors import WorkloadError
from tpu_tuner.core.run_folder import WORKERS_LOG
from tpu_tuner.runner.worker_log import WorkerLog, telling_line
from tpu_tuner.runner.worker_process import Died, Replied, WorkerProcess


@pytest.fixture
def echo_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")]))


def test_fd_level_prints_reach_the_log_not_the_terminal(
    echo_path: None, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with WorkerLog(tmp_path / "w.log") as log:
        worker = WorkerProcess("echo_worker", output=log)
        assert worker.request(("print", "hello"), timeout_s=60) == Replied("hello")
        worker.close()
    printed = capfd.readouterr()
    assert "hello" not in printed.out and "hello" not in printed.err
    text = (tmp_path / "w.log").read_text()
    assert "hello on stdout" in text and "hello on stderr" in text


def test_a_temporary_log_moves_into_the_run_folder_and_the_same_worker_writes_on(
    echo_path: None, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / WORKERS_LOG).write_text("an earlier run's line\n")  # a resumed run appends
    with WorkerLog() as log:
        temporary = log.path
        worker = WorkerProcess("echo_worker", output=log)
        assert worker.request(("print", "before"), timeout_s=60) == Replied("before")
        assert log.move_into(run_dir) == run_dir / WORKERS_LOG
        assert not temporary.exists()
        assert worker.request(("print", "after"), timeout_s=60) == Replied("after")
        worker.close()
    lines = (run_dir / WORKERS_LOG).read_text().splitlines()
    assert lines[0] == "an earlier run's line"
    assert {"before on stdout", "before on stderr", "after on stdout", "after on stderr"} <= set(lines)


def test_a_death_is_quoted_and_its_temporary_log_kept(echo_path: None, capfd: pytest.CaptureFixture[str]) -> None:
    with WorkerLog() as log:
        worker = WorkerProcess("echo_worker", output=log)
        worker.request(("print", "RuntimeError: boom"), timeout_s=60)
        assert worker.request(("exit", 3), timeout_s=60) == Died(3)
        note = log.failure_note()
    assert note == f"; last output: RuntimeError: boom on stderr (see {log.path})"
    try:
        assert "RuntimeError: boom on stdout" in log.path.read_text()  # named, so kept
    finally:
        log.path.unlink()
    assert "boom" not in capfd.readouterr().err


def test_an_unnamed_temporary_log_is_removed_and_a_silent_one_adds_nothing() -> None:
    with WorkerLog() as log:
        assert log.failure_note() == ""
        log.write(b"chatter\n")
    assert not log.path.exists()


def test_a_note_quotes_only_what_came_after_its_mark_across_a_move(tmp_path: Path) -> None:
    (tmp_path / WORKERS_LOG).write_text("ValueError: a resumed run's earlier death\n")
    with WorkerLog() as log:
        log.write(b"RuntimeError: an earlier job's\n")
        since = log.mark()
        assert log.failure_note(since=since) == ""  # nothing since: nothing to quote
        log.write(b"this job's chatter\n")
        log.move_into(tmp_path)
        log.write(b"this job's last words\n")
        assert log.failure_note(since=since) == f"; last output: this job's last words (see {WORKERS_LOG})"
        assert log.failure_note(quote=False, since=since) == f" (see {WORKERS_LOG})"
        assert log.tail(since) == "this job's chatter\nthis job's last words\n"


def test_the_telling_line_is_the_last_exception_or_abort() -> None:
    assert telling_line("ValueError: first\nframe 1\nframe 2\n") == "ValueError: first"
    assert telling_line("x\nterminate called after throwing\n  what():  bad\nstack\n") == "what():  bad"
    assert telling_line("just chatter\nlast words\n\n") == "last words"
    assert telling_line("") == ""


def test_a_worker_that_dies_importing_says_why_from_the_log(capfd: pytest.CaptureFixture[str]) -> None:
    from tpu_tuner.runner.load import load_summary
    from tpu_tuner.runner.trial_runner import TrialRunner

    model_file = FIXTURES / "noisy_exit_at_import.py"
    with TrialRunner(str(model_file), "cpu") as runner, pytest.raises(WorkloadError) as caught:
        load_summary(runner, model_file)
    message = str(caught.value)
    assert (
        "the process exited with status 3 while importing; last output: RuntimeError: the native library gave up"
        in message
    )
    kept = Path(message.rsplit("(see ", 1)[1].rstrip(")"))
    try:
        assert "some start-up chatter" in kept.read_text()
    finally:
        kept.unlink()
    assert "chatter" not in capfd.readouterr().err


def test_what_ranks_print_is_appended_to_the_log_rank_by_rank(
    echo_path: None, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from tpu_tuner.runner.launch import run_ranks

    with WorkerLog(tmp_path / "w.log") as log:
        result = run_ranks(2, "misbehaving_rank", ["raise"], timeout_s=60, output=log)
    assert not result.ok and "RuntimeError: rank 1 gave up" in (result.failure or "")
    text = (tmp_path / "w.log").read_text()
    rank_1 = text.split("--- misbehaving_rank rank 1/2 stderr ---\n", 1)[1]
    assert "RuntimeError: rank 1 gave up" in rank_1
    assert "gave up" not in capfd.readouterr().err


# --- through the CLI: the terminal holds tpu-tune's lines only ---------------------------------

NOISE = ("NOISY-IMPORT", "NOISY-STEP")


def test_profile_prints_only_its_own_lines_and_keeps_the_workers_output(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import use_probe

    from tpu_tuner.cli import main

    use_probe(monkeypatch, tmp_path / "cache")  # no roofline measurement: seconds, not the point here
    agent = tmp_path / "fast.toml"
    agent.write_text("[timing]\nmin_steps = 10\nmin_seconds = 0\n[operators]\nprofiled_steps = 1\ntop = 5\n")
    assert (
        main(
            ["-q", "profile", str(FIXTURES / "noisy_mlp.py"), "--out", str(tmp_path / "results"), "--agent", str(agent)]
        )
        == 0
    )
    printed = capfd.readouterr()
    assert "MFU" in printed.out
    assert not any(noise in printed.out + printed.err for noise in NOISE)
    (run_dir,) = (tmp_path / "results").iterdir()
    logged = (run_dir / WORKERS_LOG).read_text()
    assert all(noise in logged for noise in NOISE) and "NOISY-IMPORT through print" in logged


# Slow: a whole tuning run (~20 s here), no clock (--time-budget none): .ci/run's full pass; the quick
# CLI test checks its workers.log.
@pytest.mark.slow
def test_tune_prints_only_its_own_lines_and_keeps_the_workers_output(
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from conftest import use_probe

    from tpu_tuner.cli import main

    use_probe(monkeypatch, tmp_path_factory.mktemp("cache"), medium_relative_error=2.5e-3)
    assert (
        main(
            [
                "-q",
                str(FIXTURES / "noisy_mlp.py"),
                "--trials",
                "2",
                "--time-budget",
                "none",
                "--verify-rounds",
                "2",
                "--space",
                "precision",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    printed = capfd.readouterr()
    assert "| budget 1/2 |" in printed.out
    assert not any(noise in printed.out + printed.err for noise in NOISE), printed
    (run_dir,) = tmp_path.iterdir()
    logged = (run_dir / WORKERS_LOG).read_text()
    assert all(noise in logged for noise in NOISE)
