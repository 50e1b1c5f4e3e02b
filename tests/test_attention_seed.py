"""The compile agent seeds TorchTPU's splash attention (measured faster on a v5e chip on every
workload tried, docs/knobs.md) under a compiling execution, wherever the narrowed space searches it:
on TPU, for a model that calls SDPA; elsewhere it says why not, and on CPU nothing."""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from tpu_tuner.knobs.model_traits import of_model
from tpu_tuner.tuning.agents import attention, load_agents
from tpu_tuner.tuning.search.search_space import SearchSpace


class Attends(nn.Module):
    """A model whose forward calls SDPA (what the knob's narrowing reads from the source)."""

    def forward(self, x):
        return F.scaled_dot_product_attention(x, x, x, is_causal=True)


def _space(model: nn.Module, kind: str = "tpu") -> SearchSpace:
    return SearchSpace.load("default", kind).for_workload(of_model(model, training=True, batch_size=2))


def test_splash_is_seeded_under_the_compiling_execution_of_a_model_calling_sdpa() -> None:
    (agent,) = load_agents(["compile"], "tpu")
    seeds = agent.seeds(None, _space(Attends()))
    assert {"execution": "tpu", "attention_kernel": "splash"} in seeds
    # Not under TorchTPU's eager modes (measured under `tpu` compile), and once per execution seed.
    assert [s for s in seeds if "attention_kernel" in s] == [{"execution": "tpu", "attention_kernel": "splash"}]
    assert attention.findings(None) == [
        "the model calls SDPA: TorchTPU's splash attention kernel is seeded under a compiling execution"
    ]


def test_a_model_without_sdpa_gets_no_splash_seed_and_is_told_why() -> None:
    (agent,) = load_agents(["compile"], "tpu")
    space = _space(nn.Sequential(nn.Linear(4, 4)))
    assert not any("attention_kernel" in seed for seed in agent.seeds(None, space))
    reason = agent.left_out(attention.KNOB, None, space, lambda c: c == "splash")
    assert reason is not None and "calls no" in reason
    assert attention.findings(reason)[0].startswith("TorchTPU's splash attention: not searched here (")


def test_cpu_has_no_splash_at_all() -> None:
    (agent,) = load_agents(["compile"], "cpu")
    assert not any("attention_kernel" in seed for seed in agent.seeds(None, _space(Attends(), "cpu")))


def test_without_jax_splash_is_left_out_and_not_seeded(monkeypatch) -> None:
    """torch-tpu's splash_sdpa runs JAX's kernel: without JAX the space says so instead of a trial failing."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "jax" else real(name, *a))
    (agent,) = load_agents(["compile"], "tpu")
    space = _space(Attends())
    assert not any("attention_kernel" in seed for seed in agent.seeds(None, space))
    reason = agent.left_out(attention.KNOB, None, space, lambda c: c == "splash")
    assert reason is not None and "JAX is not installed" in reason


def test_without_a_compiling_execution_splash_is_searched_but_not_seeded_and_said_so() -> None:
    words = attention.findings(None, "the search space 'eager' does not search it on tpu")
    assert words == [
        "the model calls SDPA: TorchTPU's splash attention is searched, not seeded "
        "(the search space 'eager' does not search it on tpu)"
    ]
    assert attention.seeds({"attention_kernel": ("default", "splash")}, [{"execution": "eager:strict"}]) == []
