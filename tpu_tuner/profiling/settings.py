"""The profiler agent's settings, read from agents/profiler.toml (or a file the user names)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpu_tuner.definitions import load_definition, take_section


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
    def load(cls, name_or_path: str | Path = "profiler") -> "ProfilerSettings":
        data = load_definition("agents", name_or_path)
        where = str(name_or_path)
        warmup = take_section(data, "warmup", {"min_steps": 2, "max_steps": 20}, where)
        timing = take_section(
            data, "timing", {"min_steps": 10, "min_seconds": 1.0, "max_steps": 200}, where
        )
        operators = take_section(data, "operators", {"profiled_steps": 3, "top": 10}, where)
        verdict = take_section(data, "verdict", {"explained_share_min": 0.5, "cv_max": 0.25}, where)
        flops = take_section(data, "flops", {"uncounted_share_min": 0.05}, where)
        budget = take_section(data, "budget", {"max_step_seconds": 180.0, "max_profile_seconds": 300.0}, where)
        take_section(data, "agent", {"name": "", "description": ""}, where)
        return cls(
            warmup_min_steps=warmup["min_steps"],
            warmup_max_steps=warmup["max_steps"],
            timing_min_steps=timing["min_steps"],
            timing_min_seconds=timing["min_seconds"],
            timing_max_steps=timing["max_steps"],
            profiled_steps=operators["profiled_steps"],
            top_operators=operators["top"],
            explained_share_min=verdict["explained_share_min"],
            verdict_cv_max=verdict["cv_max"],
            uncounted_share_min=flops["uncounted_share_min"],
            max_step_seconds=budget["max_step_seconds"],
            max_profile_seconds=budget["max_profile_seconds"],
        )
