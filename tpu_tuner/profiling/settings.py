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

    @classmethod
    def load(cls, name_or_path: str | Path = "profiler") -> "ProfilerSettings":
        data = load_definition("agents", name_or_path)
        where = str(name_or_path)
        warmup = take_section(data, "warmup", {"min_steps": 2, "max_steps": 20}, where)
        timing = take_section(
            data, "timing", {"min_steps": 10, "min_seconds": 1.0, "max_steps": 200}, where
        )
        operators = take_section(data, "operators", {"profiled_steps": 3, "top": 10}, where)
        verdict = take_section(data, "verdict", {"explained_share_min": 0.5}, where)
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
        )
