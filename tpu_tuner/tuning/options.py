"""Options of a tuning run, immutable and in sections, with the documented defaults.

`TuneOptions` holds five frozen sections: `search` (what to search, how long), `objective`
(what a setting is judged by), `runner` (how a trial runs), `store` (where the study is stored,
whether shared or resumed) and `outputs` (where the run folder goes). It is built from flat keywords, each naming one
field of one section (``TuneOptions(trials=20, device="cpu")``), and read by section
(``options.search.trials``). A run never changes its options: what it resolves (the budget, the
default trial settings, a shared study's options) is a new value (``dataclasses.replace(options,
trials=12)`` takes the same flat keywords). Stored forms (result.json, a shared study's record)
are the flat keywords: `to_plain` and `from_plain`.

This module imports neither torch nor optuna: the CLI checks options before either is loaded.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_type_hints

from tpu_tuner.core.run_folder import RESULTS_DIR
from tpu_tuner.studies.samplers import SAMPLERS  # the sampler factory's own names
from tpu_tuner.studies.storage import HEARTBEAT_INTERVAL_S  # stated once, with the studies

if TYPE_CHECKING:  # imported lazily: tpu_tuner.profiling pulls in torch, and options are checked before it
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
class SearchOptions:
    """What to search and for how long."""

    # Settings to measure; None: automatic, a share of the space (tuning/budget.py).
    trials: int | None = None
    timeout_s: float | None = None
    # Stop trials that are hopeless against the best so far (tuning/pruning.py).
    prune: bool = True
    # The whole run's clock in seconds: search, race and verification fit in it (tuning/clock.py);
    # None: no limit (the trial budget alone ends the search).
    time_budget_s: float | None = 240.0
    sampler: str = "tpe"
    seed: int = 0
    space: str | Path = "default"
    agents: tuple[str, ...] = ("compile", "precision", "threads", "memory", "sharding")
    # Enqueue the best settings of earlier studies of this device kind first (tuning/warm_start.py).
    warm_start: bool = True
    # A `tpu-tune plan` folder whose ranked layouts the sharding agent seeds (with nproc > 1).
    plan: Path | None = None


@dataclass(frozen=True)
class ObjectiveOptions:
    """What a setting is judged by, and how the winner is verified.

    * ``planned_steps``: the length of the run the user plans; compile time is spread over it
      (amortised step time = steady step + compile time / planned_steps).
    * ``tolerance``: the largest relative error against the fp32 eager reference a chosen config
      may have (outputs for inference; loss and gradients for training); 1e-2 admits bf16
      autocast on the examples (docs/tuning.md).
    * ``memory_limit_bytes``: the trial worker's address-space limit, and the memory a feasible
      setting may peak at; None: the device's memory.
    """

    planned_steps: int = 5000
    tolerance: float = 1e-2
    memory_limit_bytes: int | None = None
    verify_rounds: int = 12
    # Varying input lengths (tuning/bucketing.py): a length sample file, else the workload's
    # sample_lengths(); the bucket limits the per-trial optimiser respects.
    lengths_file: Path | None = None
    max_buckets: int = 8
    bucket_align: int = 8


@dataclass(frozen=True)
class RunnerOptions:
    """How each trial runs: on which device, on how many ranks, at what sizes, for how long."""

    device: str | None = None  # None: the best device present
    # Processes each trial runs on per host, one per device: the sharding layouts searched are
    # those of nnodes x nproc ranks (`ranks`).
    nproc: int = 1
    # Hosts every trial spans (runner/hosts.py): the same command on each, joined through torch's
    # c10d rendezvous at `rdzv` (HOST:PORT) under the study's name; `node_rank` fixes this host's
    # place (a JobSet's JOB_COMPLETION_INDEX), else the rendezvous assigns it.
    nnodes: int = 1
    rdzv: str | None = None
    node_rank: int | None = None
    rdzv_timeout_s: float = RDZV_TIMEOUT_S
    # Re-rendezvous after a lost host (waiting for it to come back) this many times in a run.
    max_restarts: int = 0
    # A tensor-parallel group may span hosts (default: tensor sizes that divide nproc only).
    tensor_across_hosts: bool = False
    trial_timeout_s: float = 300.0
    batch_size: int | None = None
    seq_len: int | None = None
    # None leaves the default (`default_trial_settings()`) to the run: building it imports
    # tpu_tuner.profiling and so torch, which the CLI avoids until the options are checked.
    trial_settings: ProfilerSettings | None = field(default_factory=lambda: default_trial_settings())

    @property
    def ranks(self) -> int:
        """The processes every trial runs on, over all its hosts."""
        return self.nproc * self.nnodes


@dataclass(frozen=True)
class StoreOptions:
    """Where the study lives, and how its workers tell each other they are alive."""

    # Optuna storage URL (keyword `storage`); None: $TPU_TUNE_STORAGE, else SQLite (the run
    # folder's study.db, or the results folder's studies.db for a named study).
    url: str | None = field(default=None, metadata={"keyword": "storage"})
    # A study shared by name: every worker given the same storage and name joins it
    # (tuning/shared_study.py).
    study: str | None = None
    resume: Path | None = None  # an earlier run folder whose study continues
    # Trials keep heartbeats every `heartbeat_interval_s`; one without a beat for
    # `grace_period_s` (None: three beats) is failed as lost and queued again.
    heartbeat_interval_s: int = HEARTBEAT_INTERVAL_S
    grace_period_s: int | None = None


@dataclass(frozen=True)
class OutputOptions:
    """Where the run folder is written."""

    out: Path = Path(RESULTS_DIR)


SECTIONS: dict[str, type] = {
    "search": SearchOptions,
    "objective": ObjectiveOptions,
    "runner": RunnerOptions,
    "store": StoreOptions,
    "outputs": OutputOptions,
}


def _keyword(f: dataclasses.Field) -> str:
    return f.metadata.get("keyword", f.name)


# Flat keyword -> (section, field): the constructor's keywords and the stored form's keys.
KEYWORDS: dict[str, tuple[str, str]] = {
    _keyword(f): (section, f.name) for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)
}
# A section named like a keyword would make `TuneOptions(storage=...)` ambiguous.
assert not set(SECTIONS) & set(KEYWORDS), set(SECTIONS) & set(KEYWORDS)


@dataclass(frozen=True, init=False)
class TuneOptions:
    """How long to search, what to search, and the guardrails: five frozen sections.

    Built from flat keywords (``TuneOptions(trials=20, device="cpu")``; `KEYWORDS` says which
    section each belongs to) or from sections, flat keywords overriding the sections' fields.
    """

    search: SearchOptions
    objective: ObjectiveOptions
    runner: RunnerOptions
    store: StoreOptions
    outputs: OutputOptions

    def __init__(
        self,
        search: SearchOptions | None = None,
        objective: ObjectiveOptions | None = None,
        runner: RunnerOptions | None = None,
        store: StoreOptions | None = None,
        outputs: OutputOptions | None = None,
        **keywords: Any,
    ) -> None:
        unknown = sorted(set(keywords) - set(KEYWORDS))
        if unknown:
            raise TypeError(f"TuneOptions() got unexpected keyword argument(s): {', '.join(unknown)}")
        given = {"search": search, "objective": objective, "runner": runner, "store": store, "outputs": outputs}
        for section, cls in SECTIONS.items():
            changes = {
                name: keywords[key] for key, (where, name) in KEYWORDS.items() if where == section and key in keywords
            }
            base = given[section]
            # Frozen: set once here, as the generated __init__ of a frozen dataclass does.
            object.__setattr__(
                self, section, dataclasses.replace(base, **changes) if base is not None else cls(**changes)
            )

    def __getattr__(self, name: str) -> Any:
        """A flat read (``options.trials``) of the field its keyword names, so code written before
        the sections keeps working; the package itself reads by section."""
        if name in KEYWORDS:
            section, field_name = KEYWORDS[name]
            return getattr(object.__getattribute__(self, section), field_name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def to_plain(self) -> dict[str, Any]:
        """The flat JSON form (result.json, a shared study's record): every option by its keyword,
        the storage URL without its password (a record is read by anyone who can read the study)."""
        from tpu_tuner.core.credentials import without_password
        from tpu_tuner.core.plain_data import json_default

        plain: dict[str, Any] = {}
        for section in SECTIONS:
            values = dataclasses.asdict(getattr(self, section))
            for f in dataclasses.fields(SECTIONS[section]):
                plain[_keyword(f)] = values[f.name]
        plain["storage"] = without_password(self.store.url) if self.store.url else None
        return json.loads(json.dumps(plain, default=json_default))

    @classmethod
    def from_plain(cls, data: Mapping[str, Any], base: TuneOptions | None = None) -> TuneOptions:
        """Options from their flat JSON form (`to_plain`, or a file of an earlier version): the
        keys it holds over `base` (default: the defaults); keys no section declares are ignored."""
        from tpu_tuner.core.plain_data import from_plain
        from tpu_tuner.profiling.settings import ProfilerSettings

        names = {"ProfilerSettings": ProfilerSettings}
        typed = {}
        for key, value in data.items():
            if key in KEYWORDS:
                section, name = KEYWORDS[key]
                typed[key] = from_plain(get_type_hints(SECTIONS[section], localns=names)[name], value, names)
        return dataclasses.replace(base, **typed) if base is not None else cls(**typed)

    def validate(self) -> None:
        """Refuse numbers and combinations no run can use (UserInputError naming the flag)."""
        from tpu_tuner.core.errors import UserInputError

        search, objective, runner, store = self.search, self.objective, self.runner, self.store
        if search.sampler not in SAMPLERS:
            raise UserInputError(f"unknown sampler {search.sampler!r}; choose {', '.join(SAMPLERS)}")
        for name, value in (
            ("trials", search.trials),
            ("planned_steps", objective.planned_steps),
            ("verify_rounds", objective.verify_rounds),
            ("max_buckets", objective.max_buckets),
            ("bucket_align", objective.bucket_align),
            ("nproc", runner.nproc),
            ("nnodes", runner.nnodes),
        ):
            if value is not None and value < 1:
                raise UserInputError(f"--{name.replace('_', '-')} must be at least 1")
        if runner.nproc > MAX_NPROC:
            raise UserInputError(f"--nproc must be at most {MAX_NPROC} (ranks of one host), not {runner.nproc}")
        if search.plan is not None and runner.ranks == 1:
            raise UserInputError("--plan seeds sharding layouts, which need several ranks: give --nproc N (N > 1)")
        _validate_hosts(runner, store)
        if objective.verify_rounds < 2:
            raise UserInputError("--verify-rounds must be at least 2")
        if not objective.tolerance > 0:
            raise UserInputError("--tolerance must be positive")
        for flag, seconds in (
            ("--timeout", search.timeout_s),
            ("--trial-timeout", runner.trial_timeout_s),
            ("--time-budget", search.time_budget_s),
        ):
            if seconds is not None and not seconds > 0:
                raise UserInputError(f"{flag} must be positive, not {seconds:g}")
        if store.study is not None and not store.study.strip():
            raise UserInputError("--study needs a name")
        if store.study is not None and store.resume is not None:
            raise UserInputError("--study and --resume: a resumed run rejoins the study its folder names; give one")
        if store.heartbeat_interval_s < 1:
            raise UserInputError(f"--heartbeat-interval must be at least 1 s, not {store.heartbeat_interval_s}")
        if store.grace_period_s is not None and store.grace_period_s <= store.heartbeat_interval_s:
            raise UserInputError(
                f"--grace-period ({store.grace_period_s} s) must be longer than the heartbeat "
                f"interval ({store.heartbeat_interval_s} s)"
            )
        if objective.memory_limit_bytes is not None and objective.memory_limit_bytes <= 0:
            raise UserInputError("--trial-memory-gb must be positive")
        for flag, value in (("--batch-size", runner.batch_size), ("--seq-len", runner.seq_len)):
            if value is not None and value < 1:
                raise UserInputError(f"{flag} must be at least 1, not {value}")

    def preflight(self) -> TuneOptions:
        """Everything that can be checked without running the model, in seconds and without
        importing torch or optuna: the numbers, the search space, the agents' definitions, the
        length sample's file and the storage URL (parsed, driver installed, server reachable).
        Called before any run folder exists, so a refused start leaves nothing behind
        (docs/run-safety.md). Returns the options the run uses: with the storage URL of
        $TPU_TUNE_STORAGE where none was given (and the run does not resume)."""
        from tpu_tuner.core.errors import UserInputError
        from tpu_tuner.studies.storage import check_storage, storage_from_environment

        self.validate()
        checked = self
        if self.store.url is None and self.store.resume is None:
            checked = dataclasses.replace(self, store=dataclasses.replace(self.store, url=storage_from_environment()))
        _check_space(self.search.space, self.runner.device)
        _check_agents(self.search.agents)
        lengths_file = self.objective.lengths_file
        if lengths_file is not None and not Path(lengths_file).is_file():
            raise UserInputError("length sample file not found", lengths_file)
        if self.search.plan is not None and not (Path(self.search.plan) / "plan.json").is_file():
            raise UserInputError("not a plan folder (no plan.json; `tpu-tune plan` writes one)", self.search.plan)
        if self.store.resume is not None and not (Path(self.store.resume) / "run.json").is_file():
            raise UserInputError("not a tuning run folder (no run.json)", self.store.resume)
        if checked.store.url is not None:
            check_storage(checked.store.url)
        return checked


def _validate_hosts(runner: RunnerOptions, store: StoreOptions) -> None:
    """The multi-host flags: a rendezvous address and a study name (the rendezvous's run id, and
    what a relaunch resumes) with --nnodes above 1, nothing of them without."""
    from tpu_tuner.core.errors import UserInputError

    if runner.nnodes == 1:
        given = [
            flag for flag, value in (("--rdzv", runner.rdzv), ("--node-rank", runner.node_rank)) if value is not None
        ]
        if given:
            raise UserInputError(f"{' and '.join(given)} join hosts into one run: give --nnodes M (M > 1) too")
        return
    if not runner.rdzv:
        raise UserInputError(
            f"--nnodes {runner.nnodes}: give --rdzv HOST:PORT, the rendezvous every host joins "
            "(a port on the first host's address)"
        )
    host, _, port = runner.rdzv.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserInputError(f"--rdzv {runner.rdzv!r}: expected HOST:PORT, e.g. head-host:29400")
    if store.study is None:
        raise UserInputError(
            f"--nnodes {runner.nnodes}: give --study NAME (with --storage): the hosts meet under "
            "the study's name, and relaunching the same commands resumes it"
        )
    if runner.node_rank is not None and not 0 <= runner.node_rank < runner.nnodes:
        raise UserInputError(
            f"--node-rank {runner.node_rank}: expected 0 to {runner.nnodes - 1} (--nnodes {runner.nnodes})"
        )
    if not runner.rdzv_timeout_s > 0:
        raise UserInputError(f"--rdzv-timeout must be positive, not {runner.rdzv_timeout_s:g}")
    if runner.max_restarts < 0:
        raise UserInputError(f"--max-restarts must be at least 0, not {runner.max_restarts}")


def _check_space(space: str | Path, device: str | None) -> None:
    """Load the space as a run would: on the named device, or (auto) on at least one registered backend."""
    from tpu_tuner.core.errors import DefinitionError
    from tpu_tuner.devices import names as backend_names
    from tpu_tuner.tuning.space import SearchSpace

    kinds = [device] if device and device != "auto" else sorted(backend_names())
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


__all__ = [
    "KEYWORDS",
    "MAX_NPROC",
    "RDZV_TIMEOUT_S",
    "SAMPLERS",
    "SECTIONS",
    "ObjectiveOptions",
    "OutputOptions",
    "RunnerOptions",
    "SearchOptions",
    "StoreOptions",
    "TuneOptions",
    "default_trial_settings",
]
