"""A real PostgreSQL server for the tests: Debian's `postgresql` package, a cluster made by initdb
in a temporary folder, listening on a free port of 127.0.0.1 only, stopped (and its folder
removed) at the end. `.ci/run` installs the package; a test that needs the server fails, not
skips, without it.

The cluster runs as the `postgres` system user the package creates (initdb refuses root). It
has two roles: `tune`, trusted on loopback (no password), and `secret`, which must give its
password (scram-sha-256), so that tests can check that a password never leaks.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PASSWORD = "s3cr3t-Pa55-for-tests"  # the `secret` role's password


@dataclass(frozen=True)
class PostgresServer:
    """A running test server: `url(user)` is a SQLAlchemy / Optuna storage URL for its `tune`
    database."""

    port: int
    folder: Path

    def url(self, user: str = "tune", password: str | None = None) -> str:
        auth = f"{user}:{password}" if password else user
        return f"postgresql://{auth}@127.0.0.1:{self.port}/tune"

    def restart(self) -> None:
        """`pg_ctl restart -m fast`: every connection closed, the server back when this returns."""
        _pg_ctl(self.folder, "restart", "-m", "fast")

    def stop(self) -> None:
        """`pg_ctl stop -m fast`: the server gone (connections refused) when this returns."""
        _pg_ctl(self.folder, "stop", "-m", "fast")

    def start(self) -> None:
        """Start the stopped server again on its port."""
        _pg_ctl(self.folder, "start", "-o", _server_options(self.port, self.folder))


def _server_options(port: int, folder: Path) -> str:
    return f"-p {port} -k {folder} -c listen_addresses=127.0.0.1"


def _pg_ctl(folder: Path, *command: str) -> None:
    _as_postgres(
        [str(binaries() / "pg_ctl"), "-D", str(folder / "data"), "-w", "-t", "60", "-l", str(folder / "server.log")]
        + list(command)
    )


def binaries() -> Path:
    """Debian's PostgreSQL binaries folder (the newest major version installed)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[4]))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: apt-get install postgresql (.ci/run does)")
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _as_postgres(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run `command` as the postgres user (initdb and the server refuse root)."""

    def demote() -> None:
        user = pwd.getpwnam("postgres")
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)

    return subprocess.run(
        command, preexec_fn=demote if os.geteuid() == 0 else None, check=True, capture_output=True, text=True, **kwargs
    )  # type: ignore[call-overload]


@contextlib.contextmanager
def running_server() -> Iterator[PostgresServer]:
    """Start a server for the block; stop it and remove its cluster afterwards."""
    bin_dir = binaries()
    folder = Path(tempfile.mkdtemp(prefix="tpu-tune-pg-"))
    data = folder / "data"
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(folder, user.pw_uid, user.pw_gid)
    port = _free_port()
    try:
        _as_postgres(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth-local=trust",
                "--auth-host=reject",
                "-E",
                "UTF8",
                "--locale=C",
            ]
        )
        # Loopback only: `tune` trusted, `secret` with its password, nobody else.
        (data / "pg_hba.conf").write_text(
            "local all all trust\nhost tune tune 127.0.0.1/32 trust\nhost tune secret 127.0.0.1/32 scram-sha-256\n"
        )
        _as_postgres(
            [
                str(bin_dir / "pg_ctl"),
                "-D",
                str(data),
                "-w",
                "-t",
                "60",
                "-l",
                str(folder / "server.log"),
                "-o",
                _server_options(port, folder),
                "start",
            ]
        )
        psql = [str(bin_dir / "psql"), "-h", str(folder), "-p", str(port), "-U", "postgres", "-v", "ON_ERROR_STOP=1"]
        _as_postgres(
            [
                *psql,
                "-c",
                "CREATE ROLE tune LOGIN",
                "-c",
                f"CREATE ROLE secret LOGIN PASSWORD '{PASSWORD}'",
                "-c",
                "CREATE DATABASE tune OWNER tune",
                "-c",
                "GRANT ALL ON DATABASE tune TO secret",
            ]
        )
        _as_postgres([*psql, "-d", "tune", "-c", "GRANT ALL ON SCHEMA public TO secret"])
        yield PostgresServer(port, folder)
    finally:
        if (data / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.CalledProcessError):
                _as_postgres([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"])
        deadline = time.monotonic() + 10
        while (data / "postmaster.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        shutil.rmtree(folder, ignore_errors=True)
