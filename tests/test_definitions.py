"""Declarative definitions: built-ins by name, files by path, clear errors."""

from __future__ import annotations

import pytest

from tpu_tuner.definitions import builtin_names, load_definition
from tpu_tuner.errors import DefinitionError
from tpu_tuner.profiling import ProfilerSettings


def test_builtin_profiler_agent_loads_by_name() -> None:
    assert "profiler" in builtin_names("agents")
    settings = ProfilerSettings.load("profiler")
    assert settings.timing_min_steps >= 10  # the floor: at least 10 timed steps


def test_file_overrides_and_unknown_keys(tmp_path) -> None:
    good = tmp_path / "fast.toml"
    good.write_text("[timing]\nmin_steps = 12\nmin_seconds = 0\n")
    settings = ProfilerSettings.load(good)
    assert settings.timing_min_steps == 12 and settings.timing_min_seconds == 0.0
    assert settings.warmup_max_steps == ProfilerSettings().warmup_max_steps

    bad = tmp_path / "bad.toml"
    bad.write_text("[timing]\nmin_step = 12\n")
    with pytest.raises(DefinitionError, match=r"unknown setting \[timing\].min_step"):
        ProfilerSettings.load(bad)

    wrong_type = tmp_path / "wrong.toml"
    wrong_type.write_text('[timing]\nmin_steps = "ten"\n')
    with pytest.raises(DefinitionError, match="must be int"):
        ProfilerSettings.load(wrong_type)


def test_missing_and_malformed_definitions(tmp_path) -> None:
    with pytest.raises(DefinitionError, match="no built-in agents definition 'nope'"):
        load_definition("agents", "nope")
    broken = tmp_path / "broken.toml"
    broken.write_text("[timing\n")
    with pytest.raises(DefinitionError, match="invalid TOML"):
        load_definition("agents", broken)
