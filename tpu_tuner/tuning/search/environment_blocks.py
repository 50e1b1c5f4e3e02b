"""Settings of one start-up environment measured together, a block at a time (issue 68, item 5).

A setting whose start-up variables differ from the trial worker's (TorchTPU's DeferAndFuse eager
mode) runs in a fresh worker, and only one process may hold a TPU chip, so the old worker goes.
When the sampler alternated Strict and DeferAndFuse settings, every alternation paid a worker
start: on the chip 4 starts of 16.6-16.9 s, 37% of the README example's trial time
(docs/torchtpu.md). So once the search's trials move to an environment, the next ones are drawn
within it until `BLOCK` trials in a row have run there: the sampler's proposal is drawn again
where it leaves the environment (`studies.samplers.PreferringSampler`), which samples TPE's own
proposal conditioned on the environment, as the verification's blocks group its rounds. A
proposal the sampler still places outside (it gave no other in 16 draws) is measured: a
preference, never a rule. Settings that need no start-up variables all share one environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpu_tuner.devices import backend_class
from tpu_tuner.knobs import registry as knobs
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.capabilities import StartupEnvironment
from tpu_tuner.tuning.search.search_space import SearchSpace

# Trials in a row in one environment before the sampler may move the worker to another: a start
# costs about one trial on the chip (16.9 s against a 12.9 s median trial), so three keep starts
# to at most a quarter of the trials.
BLOCK = 3


class EnvironmentBlocks:
    """Which start-up environment the trial worker runs, how many trials in a row it has run, and
    whether a (partial) setting keeps to it (`preferred`, the sampler's test)."""

    def __init__(self, space: SearchSpace) -> None:
        self.backend = backend_class(space.device_kind)
        # The searched knobs whose values are start-up variables (the others never start a worker).
        self.names = [p.name for p in space.params if isinstance(knobs.get(p.name), StartupEnvironment)]
        self.current: dict[str, dict[str, str]] | None = None  # each knob's variables in the worker
        self.in_a_row = 0

    def variables(self, setting: Mapping[str, Any]) -> dict[str, dict[str, str]]:
        """The start-up variables of each environment knob `setting` holds (a partial one too)."""
        out = {}
        for name in self.names:
            if name in setting:
                knob = knobs.get(name)
                assert isinstance(knob, StartupEnvironment)
                out[name] = knob.environment(str(setting[name]), self.backend)
        return out

    def preferred(self, setting: Mapping[str, Any]) -> bool:
        """Whether `setting` may be proposed now: anything once the block is done (or before any
        trial), else only what runs in the worker's environment."""
        if self.current is None or self.in_a_row >= BLOCK:
            return True
        return all(self.current.get(name) == env for name, env in self.variables(setting).items())

    def measured(self, candidate: Candidate) -> None:
        """A trial of `candidate` goes to the worker: its environment is the worker's now."""
        env = self.variables({name: candidate[name] for name in self.names})
        if env == self.current:
            self.in_a_row += 1
        else:
            self.current, self.in_a_row = env, 1
