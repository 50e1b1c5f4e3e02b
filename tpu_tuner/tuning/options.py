"""Options of a tuning run, with the documented defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tpu_tuner.studies.storage import HEARTBEAT_INTERVAL_S  # stated once, with the studies

if TYPE_CHECKING:  # imported lazily: tpu_tuner.profiling pulls in torch, and options are checked before it
    from tpu_tuner.profiling.settings import ProfilerSettings

SAMPLERS = ("tpe", "random", "grid")
# Ranks of one host a trial may start (one process each): beyond this a host is oversubscribed.
MAX_NPROC = 64


@dataclass
class TuneOptions:
    """How long to search, what to search, and the guardrails.

    * ``planned_steps``: the length of the run the user plans; compile time is spread over it
      in the objective (amortised step time = steady step + compile time / planned_steps).
    * ``tolerance``: the largest relative error against the fp32 eager reference a chosen
      config may have (outputs for inference; loss and gradients for training). 1e-2 admits
      bf16 autocast on the examples (measured 2.9e-3 on gpt's gradients, 2.1e-3 on cnn's logits).
    """

    # Settings to measure; None: automatic, a share of the space (tuning/budget.py).
    trials: int | None = None
    timeout_s: float | None = None
    sampler: str = "tpe"
    seed: int = 0
    space: str | Path = "default"
    agents: tuple[str, ...] = ("compile", "precision", "threads", "memory", "sharding")
    planned_steps: int = 5000
    tolerance: float = 1e-2
    trial_timeout_s: float = 300.0
    memory_limit_bytes: int | None = None
    verify_rounds: int = 12
    device: str | None = None
    batch_size: int | None = None
    seq_len: int | None = None
    # Optuna storage URL; None: $TPU_TUNE_STORAGE, else SQLite (the run folder's study.db, or
    # the results folder's studies.db for a named study).
    storage: str | None = None
    out: Path = Path("results")
    resume: Path | None = None
    # A study shared by name (--study): every worker given the same storage and name joins it
    # (tuning/shared_study.py). Trials keep heartbeats every `heartbeat_interval_s`; one without
    # a beat for `grace_period_s` (default three beats) is failed as lost and queued again.
    study: str | None = None
    heartbeat_interval_s: int = HEARTBEAT_INTERVAL_S
    grace_period_s: int | None = None
    # Enqueue the best settings of earlier studies of this device kind first (tuning/warm_start.py).
    warm_start: bool = True
    # Varying input lengths (bucketing/knob.py): a length sample file, else the workload's
    # sample_lengths(); the bucket limits the per-trial optimiser respects.
    lengths_file: Path | None = None
    max_buckets: int = 8
    bucket_align: int = 8
    # Processes each trial runs on, one per device (--nproc): the sharding layouts searched are
    # those of this many ranks; `plan`: a `tpu-tune plan` folder whose ranked layouts are seeded.
    nproc: int = 1
    plan: Path | None = None
    # None defers the default (`default_trial_settings()`) to `tune()`: building it imports
    # tpu_tuner.profiling and so torch, which the CLI avoids until the options are checked.
    trial_settings: ProfilerSettings | None = field(default_factory=lambda: default_trial_settings())

    def validate(self) -> None:
        from tpu_tuner.core.errors import UserInputError

        if self.sampler not in SAMPLERS:
            raise UserInputError(f"unknown sampler {self.sampler!r}; choose {', '.join(SAMPLERS)}")
        for name in ("trials", "planned_steps", "verify_rounds", "max_buckets", "bucket_align", "nproc"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise UserInputError(f"--{name.replace('_', '-')} must be at least 1")
        if self.nproc > MAX_NPROC:
            raise UserInputError(f"--nproc must be at most {MAX_NPROC} (ranks of one host), not {self.nproc}")
        if self.plan is not None and self.nproc == 1:
            raise UserInputError("--plan seeds sharding layouts, which need several ranks: give --nproc N (N > 1)")
        if self.verify_rounds < 2:
            raise UserInputError("--verify-rounds must be at least 2")
        if not self.tolerance > 0:
            raise UserInputError("--tolerance must be positive")
        for name, flag in (("timeout_s", "--timeout"), ("trial_timeout_s", "--trial-timeout")):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise UserInputError(f"{flag} must be positive, not {value:g}")
        if self.study is not None and not self.study.strip():
            raise UserInputError("--study needs a name")
        if self.study is not None and self.resume is not None:
            raise UserInputError("--study and --resume: a resumed run rejoins the study its folder names; give one")
        if self.heartbeat_interval_s < 1:
            raise UserInputError(f"--heartbeat-interval must be at least 1 s, not {self.heartbeat_interval_s}")
        if self.grace_period_s is not None and self.grace_period_s <= self.heartbeat_interval_s:
            raise UserInputError(f"--grace-period ({self.grace_period_s} s) must be longer than the heartbeat interval "
                                 f"({self.heartbeat_interval_s} s)")
        if self.memory_limit_bytes is not None and self.memory_limit_bytes <= 0:
            raise UserInputError("--trial-memory-gb must be positive")
        for name, flag in (("batch_size", "--batch-size"), ("seq_len", "--seq-len")):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UserInputError(f"{flag} must be at least 1, not {value}")

    def preflight(self) -> None:
        """Everything that can be checked without running the model, in seconds and without
        importing torch or optuna: the numbers, the search space, the agents' definitions, the
        length sample's file and the storage URL (parsed, driver installed, server reachable).
        Called before any run folder exists, so a refused start leaves nothing behind
        (docs/run-safety.md)."""
        from tpu_tuner.core.errors import UserInputError
        from tpu_tuner.studies.storage import check_storage, storage_from_environment

        self.validate()
        if self.storage is None and self.resume is None:
            self.storage = storage_from_environment()
        _check_space(self.space, self.device)
        _check_agents(self.agents)
        if self.lengths_file is not None and not Path(self.lengths_file).is_file():
            raise UserInputError("length sample file not found", self.lengths_file)
        if self.plan is not None and not (Path(self.plan) / "plan.json").is_file():
            raise UserInputError("not a plan folder (no plan.json; `tpu-tune plan` writes one)", self.plan)
        if self.resume is not None and not (Path(self.resume) / "run.json").is_file():
            raise UserInputError("not a tuning run folder (no run.json)", self.resume)
        if self.storage is not None:
            check_storage(self.storage)


def _check_space(space: str | Path, device: str | None) -> None:
    """Load the search space as a run would: for the named device, or (device auto, not yet
    known) for every device kind, requiring it to search something on at least one."""
    from tpu_tuner.core.errors import DefinitionError
    from tpu_tuner.tuning.space import SearchSpace

    kinds = [device] if device and device != "auto" else ["cpu", "cuda", "tpu"]
    first_error: DefinitionError | None = None
    for kind in kinds:
        try:
            SearchSpace.load(space, kind)
            return
        except DefinitionError as exc:
            if not str(exc).endswith(f"no parameters for device {kind!r}"):
                raise  # malformed: wrong on every device
            first_error = first_error or exc
    assert first_error is not None
    raise first_error


def _check_agents(agents: tuple[str, ...]) -> None:
    """Load each agent's definition against its schema (torch-free), so that a typo in an
    agents/*.toml file is refused before the baseline profile runs, not after it."""
    from tpu_tuner.tuning.agents.schema import load_tuning_agent_definition

    for agent in agents:
        load_tuning_agent_definition(agent)


def default_trial_settings() -> ProfilerSettings:
    """Shorter timing than a profile's: a trial needs a good median, not a full report."""
    from tpu_tuner.profiling.settings import ProfilerSettings

    return ProfilerSettings(timing_min_steps=10, timing_min_seconds=0.5, timing_max_steps=100)
