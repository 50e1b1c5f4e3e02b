"""The Agent contract: a specialist for one knob family that reads the profile, never times.

* ``diagnose(profile, space)``: findings, in words, with the numbers behind them; a finding
  suggests a lever only where the search space holds it for this workload and device, and says
  why it is left out otherwise (`levers.py`);
* ``params(space)``: its part of the search space;
* ``seeds(profile, space)``: parameter settings worth trying first;
* ``validate(candidate)``: a cheap, static reason to reject a candidate, or None.

Agents that depend on the hardware decide from the measured probe (`RooflineProbe`: bf16 and
fp32 matmul rates, whether "medium" changes matmul numerics, per-op dispatch cost) when the
device has one, never from what a device kind usually has.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from tpu_tuner.core.definitions import load_schema
from tpu_tuner.devices.roofline_probe import RooflineProbe
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.tuning.agents.levers import Wanted, left_out
from tpu_tuner.tuning.agents.schema import seeds_for
from tpu_tuner.tuning.search.search_space import Param, SearchSpace


class Agent(ABC):
    """Base class of the knob-family specialists; `definition` is its checked agents/*.toml
    content (an instance of `definition_schema`; parsed TOML given as a mapping is checked here),
    `probe` the device's measured probe (None where the device's peaks are published figures)."""

    name: str
    definition_schema: ClassVar[type]  # the dataclass of its definition, in tpu_tuner.tuning.agents.schema
    definition: Any  # an instance of `definition_schema`: each agent declares its own type

    def __init__(self, definition: Any, device_kind: str, probe: RooflineProbe | None = None) -> None:
        if isinstance(definition, Mapping):
            definition = load_schema(self.definition_schema, definition, f"the {self.name} agent's definition")
        if not isinstance(definition, self.definition_schema):
            raise TypeError(f"the {self.name} agent needs a {self.definition_schema.__name__}, not {definition!r}")
        self.definition = definition
        self.device_kind = device_kind
        self.probe = probe

    def params(self, space: SearchSpace) -> tuple[Param, ...]:
        return tuple(p for p in space.searched if p.agent == self.name)

    @abstractmethod
    def diagnose(self, profile: Profile, space: SearchSpace | None = None) -> list[str]:
        """What the profile says about this agent's knobs: the levers it suggests only where
        `space` (the search space narrowed to this workload) holds them, else why not; without
        a space, the knobs' own checks for this device and workload decide (`levers.left_out`)."""

    def left_out(
        self, knob: str, profile: Profile, space: SearchSpace | None, wanted: Wanted | None = None
    ) -> str | None:
        """Why the lever (`knob`, a `wanted` choice of it) is not searched for `profile`'s
        workload on this agent's device; None where it is (`levers.left_out`)."""
        return left_out(knob, self.device_kind, profile, space, wanted)

    def seeds(self, profile: Profile | None, space: SearchSpace) -> list[dict[str, str]]:
        """Seeds from the definition's [seeds] table for this device, limited to the space."""
        owned = {p.name: p for p in self.params(space)}
        seeds = []
        for seed in seeds_for(self.definition.seeds, self.device_kind):
            params = seed if isinstance(seed, dict) else {self._seed_param(): seed}
            if params and all(name in owned and value in owned[name].choices for name, value in params.items()):
                seeds.append(dict(params))
        return seeds

    def validate(self, candidate: Candidate) -> str | None:
        return None

    def learn(self, candidate: Candidate, trial: int, failure_kind: str, message: str) -> list[dict[str, str]]:
        """Hear that measuring `candidate` (trial number `trial`) failed; an agent may then stop
        proposing what cannot run (`validate`), and return settings (parameter -> choice, the
        rest at baseline) worth measuring next to tell what failed. The study tells every agent
        of every trial whose measurement failed (an error, crash, out-of-memory or timeout; not
        a rejected, repeated, interrupted or infeasible one), an earlier run's too on resume."""
        return []

    def _seed_param(self) -> str:
        raise NotImplementedError(f"{self.name} seeds must be parameter -> choice maps")
