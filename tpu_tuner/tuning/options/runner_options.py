"""The last three sections of a tuning run's options: how a trial runs, where the study is
stored, where the run folder goes.

Each checks itself when built (`UserInputError` naming the flag) and names its flags
(`tpu_tuner.core.flags`); `tuning/options/tune_options.py` holds them together as `TuneOptions`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.field_types import check_field_types
from tpu_tuner.core.flags import BATCH_SIZE, DEVICE, OUT, SEQ_LEN, STORAGE, STUDY, at_least, option, positive, uses
from tpu_tuner.core.run_folder import RESULTS_DIR
from tpu_tuner.studies.storage import (  # stated once, with the studies
    DEFAULT_STORAGE_RETRY_S,
    HEARTBEAT_INTERVAL_S,
)

if TYPE_CHECKING:  # imported lazily: tpu_tuner.profiling pulls in torch
    from tpu_tuner.profiling.settings import ProfilerSettings

# Ranks of one host a trial may start (one process each): beyond this a host is oversubscribed.
MAX_NPROC = 64
# How long the hosts of a multi-host run wait for each other at the rendezvous, by default.
RDZV_TIMEOUT_S = 120.0


def default_trial_settings() -> ProfilerSettings:
    """Shorter timing than a profile's: a trial's median only ranks it (the race re-measures the
    leaders interleaved, and the verification the best), so 5 steps, at least 0.5 s; on the
    examples/gpt.py grid the timed steps were two thirds of the search's wall time at 10 steps
    (docs/search-efficiency.md)."""
    from tpu_tuner.profiling.settings import ProfilerSettings

    return ProfilerSettings(timing_min_steps=5, timing_min_seconds=0.5, timing_max_steps=100)


@dataclass(frozen=True)
class RunnerOptions:
    """How each trial runs: on which device, on how many ranks, at what sizes, for how long."""

    device: str | None = uses(None, DEVICE)  # None: the best device present
    nproc: int = option(
        1,
        "--nproc",
        type=int,
        metavar="N",
        help="run every trial on N ranks of this host, one process per device, and search how they "
        "share the step, training or inference (data / fsdp / tensor layouts; default %(default)s)",
    )
    # Hosts every trial spans (runner/hosts.py): the same command on each, joined through torch's
    # c10d rendezvous at `rdzv` (HOST:PORT) under the study's name; `node_rank` fixes this host's
    # place (a JobSet's JOB_COMPLETION_INDEX), else the rendezvous assigns it
    # (docs/sharding.md, "Trials across hosts").
    nnodes: int = option(
        1,
        "--nnodes",
        type=int,
        metavar="M",
        help="run every trial on M hosts of --nproc ranks each: the same command on every host, "
        "with --rdzv and --study (default %(default)s)",
    )
    rdzv: str | None = option(
        None,
        "--rdzv",
        metavar="HOST:PORT",
        help="with --nnodes: the rendezvous every host joins (torch's c10d), served by the agent on "
        "HOST, which drives the study",
    )
    node_rank: int | None = option(
        None,
        "--node-rank",
        type=int,
        metavar="K",
        help="with --nnodes: this host's place, 0 to M-1 (e.g. $JOB_COMPLETION_INDEX; default: the "
        "rendezvous assigns it, the host of --rdzv getting 0)",
    )
    rdzv_timeout_s: float = option(
        RDZV_TIMEOUT_S,
        "--rdzv-timeout",
        type=float,
        metavar="S",
        help="seconds the hosts wait for each other at the rendezvous (default %(default)g)",
    )
    max_restarts: int = option(
        0,
        "--max-restarts",
        type=int,
        metavar="R",
        help="after a host is lost, meet again (waiting for it to be started again) up to R times; "
        "else the run stops (default %(default)s)",
    )
    tensor_across_hosts: bool = option(
        False,
        "--tensor-across-hosts",
        help="with --nnodes: also search tensor sizes that do not divide --nproc (tensor groups spanning hosts)",
    )
    trial_timeout_s: float = option(
        300.0,
        "--trial-timeout",
        metavar="TRIAL_TIMEOUT",
        type=float,
        help="seconds before a trial is killed (default %(default)g)",
    )
    batch_size: int | None = uses(None, BATCH_SIZE)
    seq_len: int | None = uses(None, SEQ_LEN)
    # None: the run's default, `default_trial_settings()` (building it imports torch).
    trial_settings: ProfilerSettings | None = None

    def __post_init__(self) -> None:
        check_field_types(self)  # the Python API may pass any value
        at_least(1, ("--nproc", self.nproc), ("--nnodes", self.nnodes))
        at_least(1, ("--batch-size", self.batch_size), ("--seq-len", self.seq_len))
        if self.nproc > MAX_NPROC:
            raise UserInputError(f"--nproc must be at most {MAX_NPROC} (ranks of one host), not {self.nproc}")
        positive(("--trial-timeout", self.trial_timeout_s))
        if self.nnodes == 1:
            given = [
                name for name, value in (("--rdzv", self.rdzv), ("--node-rank", self.node_rank)) if value is not None
            ]
            if given:
                raise UserInputError(f"{' and '.join(given)} join hosts into one run: give --nnodes M (M > 1) too")
            return
        if not self.rdzv:
            raise UserInputError(
                f"--nnodes {self.nnodes}: give --rdzv HOST:PORT, the rendezvous every host joins "
                "(a port on the first host's address)"
            )
        host, _, port = self.rdzv.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UserInputError(f"--rdzv {self.rdzv!r}: expected HOST:PORT, e.g. head-host:29400")
        if self.node_rank is not None and not 0 <= self.node_rank < self.nnodes:
            raise UserInputError(
                f"--node-rank {self.node_rank}: expected 0 to {self.nnodes - 1} (--nnodes {self.nnodes})"
            )
        positive(("--rdzv-timeout", self.rdzv_timeout_s))
        at_least(0, ("--max-restarts", self.max_restarts))

    @property
    def ranks(self) -> int:
        """The processes every trial runs on, over all its hosts."""
        return self.nproc * self.nnodes


@dataclass(frozen=True)
class StoreOptions:
    """Where the study lives, and how its workers tell each other they are alive."""

    url: str | None = uses(
        None,
        STORAGE,
        help="Optuna storage URL, e.g. postgresql://user@host/db (default: $TPU_TUNE_STORAGE, else "
        "SQLite: the run folder's study.db, or with --study the results folder's studies.db); a "
        "password may also come from PGPASSWORD or ~/.pgpass",
    )
    study: str | None = uses(
        None,
        STUDY,
        help="join the study NAME in the storage (created by its first worker): every worker given "
        "the same storage and name works on one search",
    )
    resume: Path | None = option(
        None, "--resume", type=Path, metavar="RUN_DIR", help="continue the study of an earlier run folder"
    )
    heartbeat_interval_s: int = option(
        HEARTBEAT_INTERVAL_S,
        "--heartbeat-interval",
        type=int,
        metavar="S",
        help="seconds between a running trial's heartbeats (default %(default)s)",
    )
    grace_period_s: int | None = option(
        None,
        "--grace-period",
        type=int,
        metavar="S",
        help="seconds without a heartbeat before a trial's worker counts as lost and its setting is "
        "queued again (default: three heartbeats)",
    )
    # PostgreSQL studies only: studies/outage.py (docs/run-safety.md, "The database restarts").
    storage_retry_s: int = option(
        DEFAULT_STORAGE_RETRY_S,
        "--storage-retry",
        type=int,
        metavar="S",
        help="seconds to keep retrying while a PostgreSQL study's server is unreachable before this worker "
        "stops (default %(default)s)",
    )

    def __post_init__(self) -> None:
        check_field_types(self)  # the Python API may pass any value
        if self.storage_retry_s < 0:
            raise UserInputError(f"--storage-retry must be 0 or more seconds, not {self.storage_retry_s}")
        if self.study is not None and not self.study.strip():
            raise UserInputError("--study needs a name")
        if self.study is not None and self.resume is not None:
            raise UserInputError("--study and --resume: a resumed run rejoins the study its folder names; give one")
        if self.heartbeat_interval_s < 1:
            raise UserInputError(f"--heartbeat-interval must be at least 1 s, not {self.heartbeat_interval_s}")
        if self.grace_period_s is not None and self.grace_period_s <= self.heartbeat_interval_s:
            raise UserInputError(
                f"--grace-period ({self.grace_period_s} s) must be longer than the heartbeat "
                f"interval ({self.heartbeat_interval_s} s)"
            )


@dataclass(frozen=True)
class OutputOptions:
    """Where the run folder is written."""

    out: Path = uses(Path(RESULTS_DIR), OUT)
