"""Damaged state is refused in one line, exit status 2, with nothing in the run folder rewritten
(issue 39, item 5): a `--resume` of a folder whose study.db is truncated or corrupt, whose run.json
a newer tpu-tune wrote, or whose run another process holds. Each through the CLI in a subprocess:
the exit status, the one line, and every file's bytes unchanged."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from conftest import FIXTURES

from tpu_tuner.studies import run_file
from tpu_tuner.studies.run_lock import RUN_LOCK

MODEL = FIXTURES / "synthetic_speed.py"


def _run_folder(tmp_path: Path) -> Path:
    """A run folder as a run leaves it: run.json and a SQLite study with trials."""
    run_dir = tmp_path / "synthetic-tune-20260101-000000"
    run_dir.mkdir()
    url = f"sqlite:///{run_dir / 'study.db'}"
    study = optuna.create_study(storage=url, study_name=run_dir.name)
    for value in range(40):
        study.add_trial(
            optuna.trial.create_trial(
                params={"x": value},
                distributions={"x": optuna.distributions.IntDistribution(0, 100)},
                value=float(value),
            )
        )
    run_file.start(run_dir, url, run_dir.name, False, MODEL, {"model_file": str(MODEL)})
    run_file.end(run_dir, "failed", reason="interrupted")
    return run_dir


def _resume(run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpu_tuner.cli", str(MODEL), "--resume", str(run_dir), "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _bytes(run_dir: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(run_dir.iterdir())}


def _truncate(run_dir: Path) -> None:
    db = run_dir / "study.db"
    db.write_bytes(db.read_bytes()[: db.stat().st_size // 2])


def _corrupt(run_dir: Path) -> None:
    db = run_dir / "study.db"
    data = bytearray(db.read_bytes())
    data[: len(data) // 4] = b"\x00garbage" * (len(data) // 32)
    db.write_bytes(bytes(data))


def _empty(run_dir: Path) -> None:
    (run_dir / "study.db").write_bytes(b"")


def _newer(run_dir: Path) -> None:
    data = run_file.read(run_dir)
    data["format"] = run_file.FORMAT + 7
    data["fingerprint"] = {"versions": {"tpu-tune": "9.0.0"}}
    (run_dir / run_file.RUN_FILE).write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (_truncate, "resume refused: the study's database is damaged (SQLite: "),
        (_corrupt, "resume refused: the study's database is not an SQLite database (corrupt, or another file)"),
        (_empty, "resume refused: the study's database is empty; nothing was changed"),
        (_newer, f"resume refused: run.json is of format {run_file.FORMAT + 7}, written by tpu-tune 9.0.0"),
    ],
    ids=["truncated-db", "corrupt-db", "empty-db", "newer-run-json"],
)
def test_a_damaged_run_folder_is_refused_in_one_line_and_left_as_it_was(tmp_path, damage, expected) -> None:
    run_dir = _run_folder(tmp_path)
    damage(run_dir)
    before = _bytes(run_dir)
    done = _resume(run_dir)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tpu-tune: error: ") and expected in lines[0], done.stderr
    assert _bytes(run_dir) == before  # nothing written, no file added


def test_a_resume_of_a_run_another_process_holds_is_refused_naming_it(tmp_path) -> None:
    run_dir = _run_folder(tmp_path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from tpu_tuner.studies import run_lock; "
            f"run_lock.acquire({str(run_dir)!r}); print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        before = _bytes(run_dir)
        done = _resume(run_dir)
    finally:
        holder.communicate("", timeout=60)  # it lets go as it exits
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    expected = f"resume refused: the run is held by process {holder.pid} on {socket.gethostname()} (since "
    assert len(lines) == 1 and expected in lines[0] and "stop it first" in lines[0], done.stderr
    assert _bytes(run_dir) == before and RUN_LOCK in before


def test_the_lock_is_released_when_its_holder_dies_and_a_run_ending_lets_go(tmp_path) -> None:
    from tpu_tuner.studies import run_lock

    run_dir = _run_folder(tmp_path)
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os; from tpu_tuner.studies import run_lock; "
            f"run_lock.acquire({str(run_dir)!r}); os.kill(os.getpid(), 9)",
        ],
        timeout=60,
    )
    assert killed.returncode == -9
    run_lock.acquire(run_dir)  # the kernel released the dead holder's lock
    assert json.loads((run_dir / RUN_LOCK).read_text())["pid"] == os.getpid()
    run_file.end(run_dir, "done")  # the run ends: another process may resume it
    again = subprocess.run(
        [sys.executable, "-c", f"from tpu_tuner.studies import run_lock; run_lock.acquire({str(run_dir)!r})"],
        timeout=60,
    )
    assert again.returncode == 0
