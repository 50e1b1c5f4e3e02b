"""Agents: one specialist per knob family, configured by agents/*.toml."""

from __future__ import annotations

from tpu_tuner.agents.base import Agent
from tpu_tuner.backends.roofline import RooflineProbe
from tpu_tuner.agents.compile_agent import CompileAgent
from tpu_tuner.agents.precision_agent import PrecisionAgent
from tpu_tuner.definitions import load_definition

AGENT_CLASSES: dict[str, type[Agent]] = {"compile": CompileAgent, "precision": PrecisionAgent}

__all__ = ["AGENT_CLASSES", "Agent", "CompileAgent", "PrecisionAgent", "load_agents"]


def load_agents(names: list[str], device_kind: str, probe: RooflineProbe | None = None) -> list[Agent]:
    """Build the named agents from their built-in definitions; `probe` is the device's measured
    probe (the profile's ``device.probe``), which hardware-dependent decisions read."""
    return [AGENT_CLASSES[name](load_definition("agents", name), device_kind, probe) for name in names]
