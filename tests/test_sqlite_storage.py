"""A SQLite study keeps a write-ahead log synced at checkpoints (studies/liveness.SQLITE_PRAGMAS):
every connection tpu-tune opens has the pragmas, and a reader that knows nothing of them (a plain
`optuna.load_study` by URL, as optuna-dashboard opens one) in another process sees every trial
while the writer still holds the file, and after it is gone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna

from tpu_tuner.studies.liveness import open_storage
from tpu_tuner.studies.storage import SQLITE_PRAGMAS, sqlite_pragmas

optuna.logging.set_verbosity(optuna.logging.WARNING)

READ = """
import sys, optuna
study = optuna.load_study(study_name="s", storage=sys.argv[1])
print(len(study.trials), sum(t.value for t in study.trials))
"""


def _read_elsewhere(url: str) -> str:
    return subprocess.run([sys.executable, "-c", READ, url], capture_output=True, text=True, check=True).stdout.strip()


def test_a_sqlite_study_keeps_a_write_ahead_log_that_plain_readers_read(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    storage = open_storage(url)
    study = optuna.create_study(study_name="s", storage=storage)
    for value in range(5):
        trial = study.ask()
        study.tell(trial, float(value))
    with storage.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
    assert (tmp_path / "study.db-wal").exists()
    assert _read_elsewhere(url) == "5 10.0"  # the writer holds the file: trials in its log
    storage.engine.dispose()
    assert _read_elsewhere(url) == "5 10.0"


def test_a_file_on_a_network_filesystem_keeps_the_default_journal(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/vda / ext4 rw 0 0\nserver:/home /home nfs4 rw 0 0\n"
        "/dev/vdb /home/local ext4 rw 0 0\ntmpfs /tmp tmpfs rw 0 0\n"
    )
    assert sqlite_pragmas("/home/me/results/study.db", str(mounts)) == ()
    assert sqlite_pragmas("/home/local/study.db", str(mounts)) == SQLITE_PRAGMAS  # a local disk mounted inside
    assert sqlite_pragmas("/homework/study.db", str(mounts)) == SQLITE_PRAGMAS  # not under /home
    assert sqlite_pragmas("/data/study.db", str(tmp_path / "missing")) == SQLITE_PRAGMAS
