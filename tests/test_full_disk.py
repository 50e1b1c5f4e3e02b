"""A full disk (issue 39 item 2): the results folder on a 2 MiB tmpfs that the test mounts (root only:
skipped with the reason elsewhere), filled by the run's own process at a chosen moment
(fixtures/tune_on_a_filling_disk.py). The run fails with one line naming the folder and what could
not be written; the study database (study.db, on the same full filesystem) stays whole; no file is
left half-written; the dashboard reads the run as incomplete; once space is freed, ``--resume``
finishes it without measuring anything again."""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from conftest import FIXTURES

from tpu_tuner.cli import main
from tpu_tuner.core import run_folder
from tpu_tuner.core.run_folder import DiskFull, no_space_line, write_atomic
from tpu_tuner.dashboard.collect import collect
from tpu_tuner.studies import records

REPO = Path(__file__).parent.parent
PNG_END = b"IEND\xaeB`\x82"  # a PNG's last chunk: a file without it was cut short


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 2 MiB tmpfs at tmp_path/disk, unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tpu-tune-test", str(disk)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        if subprocess.run(["umount", str(disk)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _tune(disk: Path, when: str, *args: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        str(FIXTURES / "tune_on_a_filling_disk.py"),
        str(disk / "filler"),
        when,
        "-q",
        *args,
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(command, cwd=disk, env=env, capture_output=True, text=True, timeout=400)


# The run's flags, repeated on --resume (a resumed run takes its search from them, not from the folder).
RUN_FLAGS = (
    str(FIXTURES / "synthetic_speed.py"),
    "--trials",
    "3",
    "--verify-rounds",
    "3",
    "--space",
    str(FIXTURES / "eager_precision_space.toml"),
    "--sampler",
    "grid",
    "--time-budget",
    "none",
)


def _new_run(disk: Path, when: str) -> subprocess.CompletedProcess:
    return _tune(disk, when, *RUN_FLAGS, "--out", "results")


def _errors(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("tpu-tune: error:")]


def _whole_study(run_dir: Path) -> list[optuna.trial.FrozenTrial]:
    """The run's study, after SQLite's own check of the whole file."""
    with sqlite3.connect(run_dir / run_folder.STUDY_DB) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    (summary,) = optuna.get_all_study_summaries(f"sqlite:///{run_dir / run_folder.STUDY_DB}")
    return optuna.load_study(
        study_name=summary.study_name, storage=f"sqlite:///{run_dir / run_folder.STUDY_DB}"
    ).get_trials()


def _nothing_half_written(run_dir: Path) -> None:
    assert not [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")]  # write_atomic's temporaries
    for png in run_dir.glob("*.png"):
        assert png.read_bytes().endswith(PNG_END), png
    if (run_dir / run_folder.TRIALS_CSV).exists():
        assert (run_dir / run_folder.TRIALS_CSV).read_text().endswith("\n")


def _measured(trials: list[optuna.trial.FrozenTrial]) -> list[tuple]:
    return sorted(
        tuple(sorted(t.params.items()))
        for t in trials
        if t.state == optuna.trial.TrialState.COMPLETE
        and records.attrs(t).get(records.MEASURED)
        and records.REPEAT_OF not in records.attrs(t)
    )


def _resume_on_free_space(disk: Path, run_dir: Path, measured_before: list[tuple]) -> list[tuple]:
    (disk / "filler").unlink()  # space freed
    resumed = _tune(disk, "never", *RUN_FLAGS, "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (run_dir / run_folder.TUNED_CONFIG).is_file() and (run_dir / run_folder.REPORT_MD).is_file()
    trials = _whole_study(run_dir)
    after = _measured(trials)
    assert set(measured_before) <= set(after) and len(after) == len(set(after))  # nothing measured twice
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    _nothing_half_written(run_dir)
    (row,) = collect(disk / "results").runs.to_dict("records")
    assert row["status"] not in ("incomplete", "failed", "unreadable"), row
    return after


@pytest.mark.slow  # two tuning runs end to end (no clock: RUN_FLAGS' --time-budget none): about 80 s on 2 cores
def test_a_disk_full_while_writing_the_results_fails_in_one_line_and_resume_completes(small_disk: Path) -> None:
    done = _new_run(small_disk, "outputs")
    assert done.returncode == 1, done.stderr[-3000:]
    (run_dir,) = (small_disk / "results").iterdir()
    (line,) = _errors(done)
    assert line.startswith(f"tpu-tune: error: no space left on the device of {run_dir.relative_to(small_disk)}/: ")
    assert " could not be written (nothing half-written was left" in line and "Traceback" not in done.stderr
    assert not (run_dir / run_folder.TUNED_CONFIG).exists()
    _nothing_half_written(run_dir)
    trials = _whole_study(run_dir)  # the search was over: every trial in, none left running
    assert len(_measured(trials)) >= 2 and not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    # The dashboard: no tuned_config.toml, its process gone: incomplete, no figures of a finished run.
    (row,) = collect(small_disk / "results").runs.to_dict("records")
    assert row["status"] == "incomplete" and "--resume" in row["reason"], row
    assert row.get("speedup") is None or row["speedup"] != row["speedup"]  # None or NaN
    assert _resume_on_free_space(small_disk, run_dir, _measured(trials)) == _measured(trials)  # the search was done


@pytest.mark.slow  # two tuning runs end to end (no clock: RUN_FLAGS' --time-budget none): about 80 s on 2 cores
def test_a_disk_full_mid_search_leaves_the_study_database_whole_and_resume_completes(small_disk: Path) -> None:
    """study.db is in the run folder, on the full filesystem: the next write to it fails, SQLite
    rolls that transaction back, and the run stops in one line; what was told before stays."""
    done = _new_run(small_disk, "trial:2")  # as trial 2 starts: trial 1 is told, trial 2's writes find no room
    assert done.returncode == 1, done.stderr[-3000:]
    (line,) = _errors(done)
    assert line.startswith("tpu-tune: error: no space left on the device of the study's database: it could not be")
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    (run_dir,) = (small_disk / "results").iterdir()
    trials = _whole_study(run_dir)
    assert len(_measured(trials)) == 1  # trial 1, told before the disk filled, is in
    # Trial 2's result could not be written: it stays RUNNING until the resume marks it interrupted.
    assert [t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING] == [1]
    _nothing_half_written(run_dir)
    _resume_on_free_space(small_disk, run_dir, _measured(trials))


def test_write_atomic_on_a_full_disk_names_the_folder_and_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "report.md"
    target.write_text("the old report\n")

    class FullFile:  # a file on a full filesystem: the open succeeds, the write finds no room
        def __init__(self, fd: int, mode: str) -> None:
            os.close(fd)

        def __enter__(self) -> FullFile:
            return self

        def __exit__(self, *exc_info: object) -> None:
            pass

        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fdopen", FullFile)
    with pytest.raises(DiskFull) as raised:
        write_atomic(target, "a new report that does not fit\n")
    monkeypatch.undo()
    assert str(raised.value) == (
        f"no space left on the device of {tmp_path}/: report.md could not be written (nothing half-written "
        f"was left; free some space, then continue a tuning run with --resume {tmp_path})"
    )
    assert raised.value.errno == errno.ENOSPC and isinstance(raised.value, OSError)
    assert target.read_text() == "the old report\n" and [p.name for p in tmp_path.iterdir()] == ["report.md"]


def test_the_cli_says_a_full_disk_in_one_line(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from tpu_tuner.cli import profile

    def full(args: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "results/x/plan.json")

    monkeypatch.setattr(profile, "run", full)
    assert main(["profile", str(FIXTURES / "synthetic_speed.py")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "tpu-tune: error: no space left on the device: results/x/plan.json could not be written "
        "(No space left on device)"
    ]
    try:  # Optuna's error, raised from SQLAlchemy's, raised from sqlite3's
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as full:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from full
    except optuna.exceptions.StorageInternalError as wrapped:
        assert (no_space_line(wrapped) or "").startswith("no space left on the device of the study's database")
    assert no_space_line(OSError(errno.EACCES, "denied")) is None
