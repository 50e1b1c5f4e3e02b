"""What each agent's TOML definition may say: one frozen dataclass per table, every key required.

Kept free of torch so that `tpu-tune tune` can check the definitions before anything heavy is
imported (`TuneOptions.preflight`). The agents read these typed fields; a typo in a file is an
error when it is loaded (`tpu_tuner.core.definitions.load_schema`), never a rule left at a default.
Adding a key to an agents/*.toml file means adding it here. A [seeds] table of settings tried
first per device is keyed by the registered backends' names (`tpu_tuner.devices.names`, which
imports no torch): a backend the table leaves out has none, and an unknown name is an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_tuner.core.definitions import AgentHeader, load_agent_definition
from tpu_tuner.core.errors import DefinitionError
from tpu_tuner.devices import names as backend_names

# --- the compile agent (agents/compile.toml) ----------------------------------------------------


@dataclass(frozen=True)
class CompileDiagnose:
    """[diagnose]: which findings to report."""

    overhead_bound_hint: bool  # say that a compiler should cut dispatch time of an overhead-bound step


@dataclass(frozen=True)
class CompileValidate:
    """[validate]: cheap static rejections."""

    require_cxx_for_inductor_on_cpu: bool


@dataclass(frozen=True)
class CompileDefinition:
    """The schema of agents/compile.toml."""

    agent: AgentHeader
    diagnose: CompileDiagnose
    seeds: dict[str, tuple[str | dict[str, str], ...]]  # backend -> an `execution` choice or a parameter -> choice map
    validate: CompileValidate


# --- the precision agent (agents/precision.toml) ------------------------------------------------


@dataclass(frozen=True)
class PrecisionDiagnose:
    """[diagnose]: when a step counts as matmul-heavy."""

    compute_share_hint: float


@dataclass(frozen=True)
class PrecisionValidate:
    """[validate]: cheap static rejections."""

    skip_high_on_cpu: bool
    skip_float16_on_cpu: bool


@dataclass(frozen=True)
class PrecisionHardware:
    """[hardware]: decisions from the device's measured probe."""

    skip_medium_without_effect: bool
    seed_bf16_min_ratio: float
    reject_bf16_below_ratio: float


@dataclass(frozen=True)
class PrecisionDefinition:
    """The schema of agents/precision.toml."""

    agent: AgentHeader
    diagnose: PrecisionDiagnose
    seeds: dict[str, tuple[dict[str, str], ...]]  # backend -> parameter -> choice maps
    validate: PrecisionValidate
    hardware: PrecisionHardware


# --- the threads agent (agents/threads.toml) --------------------------------------------------


@dataclass(frozen=True)
class ThreadsSeeds:
    """[seeds]: when fewer intra-op threads than torch's default are tried first (any one suffices)."""

    overhead_share_min: float  # the verdict's dispatch share of the step at least this
    op_microseconds_max: float  # the step's mean time per aten op (step / ops per step) at most this
    contention_cv_min: float  # the step times' robust CV at least this (other work on the cores)


@dataclass(frozen=True)
class ThreadsDefinition:
    """The schema of agents/threads.toml."""

    agent: AgentHeader
    seeds: ThreadsSeeds


# --- the memory agent (agents/memory.toml) ------------------------------------------------------


@dataclass(frozen=True)
class MemorySeeds:
    """[seeds]: when the memory knob is tried first."""

    near_limit_share: float  # seed when the baseline's peak memory is at least this share of the limit
    activation_checkpointing: str  # the activation_checkpointing choice seeded then


@dataclass(frozen=True)
class MemoryDefinition:
    """The schema of agents/memory.toml."""

    agent: AgentHeader
    seeds: MemorySeeds


# --- the sharding agent (agents/sharding.toml) --------------------------------------------------


@dataclass(frozen=True)
class ShardingSeeds:
    """[seeds]: the layouts tried first."""

    families: tuple[str, ...]  # layout families (knobs/layout.py FAMILIES) seeded without a plan, in order
    inference_families: tuple[str, ...]  # the same for an inference step (a forward alone)
    plan_top: int  # with --plan: how many of the plan's fitting layouts are enqueued


@dataclass(frozen=True)
class ShardingValidate:
    """[validate]: when a layout is given up."""

    measure_alone_after_error: bool  # on a layout's error, measure it alone; give up a layout that fails alone


@dataclass(frozen=True)
class ShardingDefinition:
    """The schema of agents/sharding.toml."""

    agent: AgentHeader
    seeds: ShardingSeeds
    validate: ShardingValidate


# Agent name -> the schema of its definition: the agents `tpu-tune tune` can use.
AGENT_DEFINITIONS: dict[str, type] = {
    "compile": CompileDefinition,
    "precision": PrecisionDefinition,
    "threads": ThreadsDefinition,
    "memory": MemoryDefinition,
    "sharding": ShardingDefinition,
}


def seeds_for(seeds: Any, device_kind: str) -> tuple[Any, ...]:
    """The [seeds] entries of one backend, where the table is per backend (none for one it leaves out)."""
    return tuple(seeds.get(device_kind, ())) if isinstance(seeds, dict) else ()


def load_tuning_agent_definition(agent: str, name_or_path: str | Path | None = None) -> Any:
    """The checked definition of a tuning agent: its built-in file, or a whole file of its own."""
    if agent not in AGENT_DEFINITIONS:
        raise DefinitionError(f"unknown agent {agent!r}; known: {', '.join(AGENT_DEFINITIONS)}")
    definition: Any = load_agent_definition(AGENT_DEFINITIONS[agent], agent, name_or_path)
    seeds = getattr(definition, "seeds", None)
    unknown = sorted(set(seeds) - set(backend_names())) if isinstance(seeds, dict) else []
    if unknown:
        where = f"agents/{agent}.toml" if name_or_path is None else name_or_path
        raise DefinitionError(f"unknown key [seeds].{unknown[0]} (known: {', '.join(sorted(backend_names()))})", where)
    return definition
