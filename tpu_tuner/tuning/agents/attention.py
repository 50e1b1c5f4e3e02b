"""The compile agent's reasoning about the attention kernel (the `attention_kernel` knob: TorchTPU's
splash attention, tpu_tuner/knobs/attention_kernel.py).

* seeded (splash under each compiling execution seed) wherever the space searches it: the space
  offers it only on TPU and only to a model that calls SDPA, and on a v5e chip it was faster on
  every workload measured (docs/knobs.md, "TorchTPU's levers"): a 335M decoder's training step
  at 8 x 2048 601 -> 491 ms, the README example 1.05x (1.01-1.09). It keeps no score matrix, so it
  also frees the memory a long sequence's attention would hold.
"""

from __future__ import annotations

from tpu_tuner.knobs.attention_kernel import SPLASH
from tpu_tuner.knobs.execution import compile_options
from tpu_tuner.tuning.agents.levers import not_searched

KNOB = "attention_kernel"


def findings(left_out: str | None = None, compiling_left_out: str | None = None) -> list[str]:
    """What the agent says of the attention kernel where the knob applies to the device (the caller
    asks): seeded, or why the space does not search it (`left_out`); searched but not seeded where
    no compiling execution is (`compiling_left_out`: why)."""
    if left_out is not None:
        return [not_searched("TorchTPU's splash attention", left_out)]
    if compiling_left_out is not None:
        return [f"the model calls SDPA: TorchTPU's splash attention is searched, not seeded ({compiling_left_out})"]
    return ["the model calls SDPA: TorchTPU's splash attention kernel is seeded under a compiling execution"]


def seeds(choices: dict[str, tuple[str, ...]], execution_seeds: list[dict[str, str]]) -> list[dict[str, str]]:
    """Each compiling execution seed with splash attention, where the space searches it."""
    if SPLASH not in choices.get(KNOB, ()):
        return []
    compiling = [seed for seed in execution_seeds if compile_options(seed.get("execution", "eager")) is not None]
    return [{**seed, KNOB: SPLASH} for seed in compiling]
