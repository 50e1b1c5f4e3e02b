"""Check an Optuna storage URL before anything runs: parsable, a known database, its driver
installed, and (for a database server) reachable within a few seconds.

Without it a bad `--storage` failed only when the study was opened, after the baseline profile
(48 s measured for ``notadb://x``), and left a run folder behind. Imports SQLAlchemy only, not
optuna or torch, so the check takes well under a second. See docs/run-safety.md.
"""

from __future__ import annotations

import os
from pathlib import Path

from tpu_tuner.core.credentials import redact
from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.user_paths import expand_user

# The pip extra that installs each server database's default driver (pyproject.toml).
DRIVER_EXTRAS = {"postgresql": "postgres"}
CONNECT_TIMEOUT_S = 5
# The storage URL when no --storage is given: lets a password-bearing URL stay out of shell
# history and process listings (with libpq's own PGPASSWORD / PGPASSFILE / ~/.pgpass for the
# password alone).
STORAGE_ENV = "TPU_TUNE_STORAGE"
# The SQLite file, in the results folder, that holds the named studies of one host when there
# is no server (`--study NAME` without --storage): workers on this host share it.
SHARED_SQLITE = "studies.db"
# Seconds between a running trial's heartbeats, the default of every study tpu-tune opens
# (studies/liveness.py: other workers call a trial lost after three missed beats).
HEARTBEAT_INTERVAL_S = 10
# Seconds a worker retries while its study's server is unreachable before it stops
# (`--storage-retry`, studies/outage.py): longer than a server restart or a managed database's
# failover (a minute or two), short enough that a worker whose database is gone does not hang
# for the night.
DEFAULT_STORAGE_RETRY_S = 300


def storage_from_environment() -> str | None:
    """The storage URL `TPU_TUNE_STORAGE` names, or None."""
    return os.environ.get(STORAGE_ENV) or None


def shared_sqlite(out: str | Path) -> str:
    """The URL of the results folder's shared SQLite file."""
    return f"sqlite:///{(Path(out) / SHARED_SQLITE).resolve()}"


def keeps_journal(url: str) -> bool:
    """Whether tpu-tune keeps the studies of `url` in a journal of its own (PostgreSQL,
    studies/journal.py), which optuna-dashboard cannot open by URL, rather than in Optuna's RDB
    tables (SQLite, MySQL)."""
    from sqlalchemy.engine import make_url

    return make_url(url).get_backend_name() == "postgresql"


# SQLite's write-ahead log, synced at checkpoints rather than at every commit (measured: docs/many-workers.md,
# "SQLite: a write-ahead log"). A commit survives a crash of the process, not of the machine. Not on a
# network filesystem, where the log's shared memory does not work (https://www.sqlite.org/wal.html).
SQLITE_PRAGMAS = ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL")
NETWORK_FILESYSTEMS = (
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "9p",
    "lustre",
    "gpfs",
    "fuse.sshfs",
    "ceph",
    "glusterfs",
)


def sqlite_pragmas(database: str | None, mounts: str = "/proc/mounts") -> tuple[str, ...]:
    """The pragmas each connection to the SQLite file `database` runs: `SQLITE_PRAGMAS`, or none
    where the file lies on a network filesystem (by the longest mount point of `mounts` above it)."""
    if not database or database == ":memory:":
        return ()
    path, kind = str(Path(database).resolve()), ""
    try:
        entries = [line.split()[1:3] for line in Path(mounts).read_text().splitlines() if len(line.split()) > 2]
    except OSError:
        entries = []
    for point, fstype in sorted(entries, key=lambda entry: len(entry[0])):
        if path == point or path.startswith(point.rstrip("/") + "/"):
            kind = fstype
    return () if kind in NETWORK_FILESYSTEMS else SQLITE_PRAGMAS


def check_storage(url: str, connect: bool = True, connect_timeout_s: int = CONNECT_TIMEOUT_S) -> None:
    """Raise `UserInputError` (with the password removed) when `url` cannot hold a study."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    shown = redact(url)
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise UserInputError(
            f"--storage {shown!r} is not a database URL (e.g. sqlite:///study.db or postgresql://user@host/db)"
        ) from exc
    try:
        dialect = parsed.get_dialect()
    except NoSuchModuleError as exc:
        raise UserInputError(
            f"--storage {shown!r}: unknown database kind {parsed.drivername!r} (sqlite, postgresql, mysql, ...)"
        ) from exc
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        extra = DRIVER_EXTRAS.get(parsed.get_backend_name())
        if extra and exc.name == "psycopg":
            hint = f'pip install -e ".[{extra}]"'
        elif exc.name == "psycopg2":  # SQLAlchemy < 2.1's default, or postgresql+psycopg2:// written out
            hint = 'pip install psycopg2-binary, or pip install -e ".[postgres]" and write postgresql+psycopg://'
        else:
            hint = f"install the Python package {exc.name or 'of its driver'}"
        raise UserInputError(
            f"--storage {shown!r}: its database driver is not installed "
            f"({type(exc).__name__}: {redact(str(exc))}); {hint}"
        ) from exc
    if parsed.get_backend_name() == "sqlite":
        _check_sqlite(parsed.database, shown)
    elif connect:
        _check_connects(url, parsed.get_backend_name(), shown, connect_timeout_s)


def _check_sqlite(database: str | None, shown: str) -> None:
    if not database or database == ":memory:":
        raise UserInputError(f"--storage {shown!r}: an in-memory SQLite database cannot be resumed; name a file")
    folder = expand_user(database, f"--storage {shown!r}").resolve().parent
    if not folder.is_dir():
        raise UserInputError(f"--storage {shown!r}: folder {folder} does not exist")


SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file


def check_sqlite_study(url: str) -> None:
    """Refuse (`UserInputError`, one line) to resume a study whose SQLite file is empty, truncated
    or corrupt: opened read-only and checked (``PRAGMA quick_check``, which reads the whole file),
    so that nothing is written to it. Optuna would otherwise create its tables in an emptied file
    (the trials gone without a word), or fail halfway through the run with "database disk image is
    malformed". A missing file is no damage: the run stopped before its study was made."""
    import sqlite3

    from sqlalchemy.engine import make_url

    database = make_url(url).database
    if not database or database == ":memory:":
        return
    path = expand_user(database, url)
    try:
        with path.open("rb") as file:
            header = file.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UserInputError(f"resume refused: the study's database cannot be read ({exc.strerror})", path) from exc
    if header != SQLITE_HEADER:
        what = "empty" if not header else "not an SQLite database (corrupt, or another file)"
        raise UserInputError(f"resume refused: the study's database is {what}; nothing was changed", path)
    try:
        connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            verdict = connection.execute("PRAGMA quick_check").fetchone()[0]
        finally:
            connection.close()
    except sqlite3.Error as exc:
        verdict = str(exc)
    if verdict != "ok":
        raise UserInputError(
            f"resume refused: the study's database is damaged (SQLite: {verdict}); nothing was changed", path
        )


def _check_connects(url: str, backend: str, shown: str, timeout_s: int) -> None:
    from sqlalchemy import create_engine, text

    # psycopg2 and the MySQL drivers take connect_timeout; others get none (they use their own).
    connect_args = {"connect_timeout": timeout_s} if backend in ("postgresql", "mysql", "mariadb") else {}
    engine = create_engine(url, connect_args=connect_args, poolclass=None)
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:
        first = redact(str(exc)).strip().splitlines()[0] if str(exc).strip() else ""
        raise UserInputError(f"cannot connect to the study storage {shown!r}: {type(exc).__name__}: {first}") from exc
    finally:
        engine.dispose()


__all__ = [
    "DEFAULT_STORAGE_RETRY_S",
    "HEARTBEAT_INTERVAL_S",
    "STORAGE_ENV",
    "check_sqlite_study",
    "check_storage",
    "keeps_journal",
    "shared_sqlite",
    "sqlite_pragmas",
    "storage_from_environment",
]
