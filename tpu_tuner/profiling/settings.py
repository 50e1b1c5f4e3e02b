"""The profiler agent's settings, read from agents/profiler.toml (or a file the user names)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpu_tuner.core.definitions import AgentHeader, load_agent_definition


@dataclass(frozen=True)
class ProfilerSettings:
    """How much to warm up and time, what to profile, and the verdict threshold."""

    warmup_min_steps: int = 2
    warmup_max_steps: int = 20
    timing_min_steps: int = 10
    timing_min_seconds: float = 1.0
    timing_max_steps: int = 200
    profiled_steps: int = 3
    top_operators: int = 10
    explained_share_min: float = 0.5
    verdict_cv_max: float = 0.25  # a step-time CV above this marks the verdict uncertain
    # An operator with no FLOP formula taking at least this share of the step is reported and
    # makes the MFU a lower bound (docs/flops.md).
    uncounted_share_min: float = 0.05
    # Time budget: refuse a step estimated (meta-device pass) to take longer than
    # `max_step_seconds`; stop warming up, timing and profiling once `max_profile_seconds` have
    # passed (at least one step of each still runs).
    max_step_seconds: float = 180.0
    max_profile_seconds: float = 300.0

    @classmethod
    def load(cls, name_or_path: str | Path = "profiler") -> ProfilerSettings:
        """The built-in profiler definition, or a file overriding some of its keys; a key the
        schema (`ProfilerDefinition`) does not know, or of the wrong type, is a `DefinitionError`."""
        definition = load_agent_definition(ProfilerDefinition, "profiler", name_or_path, overrides=True)
        return cls(
            warmup_min_steps=definition.warmup.min_steps,
            warmup_max_steps=definition.warmup.max_steps,
            timing_min_steps=definition.timing.min_steps,
            timing_min_seconds=definition.timing.min_seconds,
            timing_max_steps=definition.timing.max_steps,
            profiled_steps=definition.operators.profiled_steps,
            top_operators=definition.operators.top,
            explained_share_min=definition.verdict.explained_share_min,
            verdict_cv_max=definition.verdict.cv_max,
            uncounted_share_min=definition.flops.uncounted_share_min,
            max_step_seconds=definition.budget.max_step_seconds,
            max_profile_seconds=definition.budget.max_profile_seconds,
        )


# --- agents/profiler.toml, table by table (every key required: a file given to --agent is laid
# over the built-in one, so it names only what it changes) -------------------------------------


@dataclass(frozen=True)
class WarmupTable:
    """[warmup]: steps run before timing."""

    min_steps: int
    max_steps: int


@dataclass(frozen=True)
class TimingTable:
    """[timing]: how many steps, and how long, to time."""

    min_steps: int
    min_seconds: float
    max_steps: int


@dataclass(frozen=True)
class OperatorsTable:
    """[operators]: the torch.profiler pass for the top-operator table."""

    profiled_steps: int
    top: int


@dataclass(frozen=True)
class VerdictTable:
    """[verdict]: when a term explains the step, and when the timing is too noisy to say."""

    explained_share_min: float
    cv_max: float


@dataclass(frozen=True)
class FlopsTable:
    """[flops]: when uncounted operators make the MFU a lower bound."""

    uncounted_share_min: float


@dataclass(frozen=True)
class BudgetTable:
    """[budget]: the time limits of one step and of a whole profile."""

    max_step_seconds: float
    max_profile_seconds: float


@dataclass(frozen=True)
class ProfilerDefinition:
    """The schema of agents/profiler.toml."""

    agent: AgentHeader
    warmup: WarmupTable
    timing: TimingTable
    operators: OperatorsTable
    verdict: VerdictTable
    flops: FlopsTable
    budget: BudgetTable
