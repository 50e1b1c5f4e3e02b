"""Agents: one specialist per knob family, configured by agents/*.toml.

The agent classes import torch; they are imported on first use (PEP 562), so that the schemas
of their definitions (`tpu_tuner.tuning.agents.schema`) can be checked before torch is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpu_tuner.core.lazy import lazy_exports

if TYPE_CHECKING:
    from tpu_tuner.devices.roofline_probe import RooflineProbe
    from tpu_tuner.tuning.agents.base import Agent

_EXPORTS = {
    "Agent": "tpu_tuner.tuning.agents.base",
    "CompileAgent": "tpu_tuner.tuning.agents.compile_agent",
    "PrecisionAgent": "tpu_tuner.tuning.agents.precision_agent",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["Agent", "CompileAgent", "PrecisionAgent", "load_agents"]


def agent_classes() -> dict[str, type[Agent]]:
    """Agent name -> class, for every agent `tpu-tune tune` can use."""
    from tpu_tuner.tuning.agents.compile_agent import CompileAgent
    from tpu_tuner.tuning.agents.memory_agent import MemoryAgent
    from tpu_tuner.tuning.agents.precision_agent import PrecisionAgent
    from tpu_tuner.tuning.agents.sharding_agent import ShardingAgent
    from tpu_tuner.tuning.agents.threads_agent import ThreadsAgent

    return {
        "compile": CompileAgent,
        "precision": PrecisionAgent,
        "threads": ThreadsAgent,
        "memory": MemoryAgent,
        "sharding": ShardingAgent,
    }


def load_agents(names: list[str], device_kind: str, probe: RooflineProbe | None = None) -> list[Agent]:
    """Build the named agents from their built-in definitions (checked against their schemas,
    `tpu_tuner.tuning.agents.schema`); `probe` is the device's measured probe (the profile's
    ``device.probe``), which hardware-dependent decisions read."""
    from tpu_tuner.tuning.agents.schema import load_tuning_agent_definition

    classes = agent_classes()
    return [classes[name](load_tuning_agent_definition(name), device_kind, probe) for name in names]
