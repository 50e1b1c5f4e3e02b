"""The Agent contract: a specialist for one knob family that reads the profile, never times.

* ``diagnose(profile)``: findings, in words, with the numbers behind them;
* ``params(space)``: its part of the search space;
* ``seeds(profile, space)``: parameter settings worth trying first;
* ``validate(candidate)``: a cheap, static reason to reject a candidate, or None.

Agents that depend on the hardware decide from the measured probe (`RooflineProbe`: bf16 and
fp32 matmul rates, whether "medium" changes matmul numerics, per-op dispatch cost) when the
device has one, never from what a device kind usually has.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from tpu_tuner.backends.roofline import RooflineProbe
from tpu_tuner.candidate import Candidate
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.search.space import Param, SearchSpace


class Agent(ABC):
    """Base class of the knob-family specialists; `definition` is its agents/*.toml content,
    `probe` the device's measured probe (None where the device's peaks are published figures)."""

    name: str

    def __init__(self, definition: dict[str, Any], device_kind: str, probe: RooflineProbe | None = None) -> None:
        self.definition = definition
        self.device_kind = device_kind
        self.probe = probe

    def params(self, space: SearchSpace) -> tuple[Param, ...]:
        return tuple(p for p in space.searched if p.agent == self.name)

    @abstractmethod
    def diagnose(self, profile: Profile) -> list[str]:
        """What the profile says about this agent's knobs."""

    def seeds(self, profile: Profile | None, space: SearchSpace) -> list[dict[str, str]]:
        """Seeds from the definition's [seeds] table for this device, limited to the space."""
        owned = {p.name: p for p in self.params(space)}
        seeds = []
        for seed in self.definition.get("seeds", {}).get(self.device_kind, []):
            params = seed if isinstance(seed, dict) else {self._seed_param(): seed}
            if params and all(name in owned and value in owned[name].choices for name, value in params.items()):
                seeds.append(dict(params))
        return seeds

    def validate(self, candidate: Candidate) -> str | None:
        return None

    def _seed_param(self) -> str:
        raise NotImplementedError(f"{self.name} seeds must be parameter -> choice maps")
