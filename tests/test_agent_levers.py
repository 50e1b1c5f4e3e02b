"""Issue 55 item 8: an agent's finding suggests a lever only where the search space holds it for
the workload and device, and otherwise says it is not searched and why (a profile said "int8
quantized linears (torchao) may pay off" for a model whose space then left quantization out)."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace
from typing import Any

import pytest
from helpers.common import AMX, matmul_heavy_profile, pin_cores, precision_agent, threads_profile

from tpu_tuner.core.definitions import load_definition
from tpu_tuner.knobs.quantization import NO_TORCHAO
from tpu_tuner.knobs.traits import WorkloadTraits
from tpu_tuner.model.workloads.profiled import ProfiledWorkload
from tpu_tuner.profiling.verdict import decide
from tpu_tuner.tuning.agents import CompileAgent, load_agents
from tpu_tuner.tuning.search.search_space import SearchSpace

SUGGESTED = "int8 quantized linears (torchao) may pay off"


def _linear_heavy(linear_layers: int | None = 4) -> SimpleNamespace:
    """An inference step spending 80% in linear layers' matmuls; with traits where given."""
    profile = matmul_heavy_profile(training=False)
    if linear_layers is not None:
        traits = WorkloadTraits(False, 0, 0, 8, linear_layers=linear_layers).to_dict()
        del traits["training"]
        profile.workload = ProfiledWorkload("m", "m.py", "native", False, 8, traits=traits)
    return profile


def test_a_space_without_quantization_gets_no_quantization_suggestion() -> None:
    agent, profile = precision_agent(AMX), _linear_heavy()
    with_it = " ".join(agent.diagnose(profile, SearchSpace.load("default", "cpu").for_workload(_traits(profile))))
    assert SUGGESTED in with_it
    # The precision space has no quantization parameter at all: said so, not suggested.
    without = " ".join(agent.diagnose(profile, SearchSpace.load("precision", "cpu")))
    assert SUGGESTED not in without
    assert (
        "linear layers take 80% of profiled self time; int8 quantized linears (torchao): not searched here "
        "(the search space 'precision' does not search it on cpu)"
    ) in without
    assert not any("quantization" in seed for seed in agent.seeds(profile, SearchSpace.load("precision", "cpu")))


def _traits(profile: SimpleNamespace) -> WorkloadTraits:
    from tpu_tuner.knobs.traits import of_profile

    traits = of_profile(profile.workload)
    assert traits is not None
    return traits


def test_the_reason_is_the_space_s_own_note_and_the_knob_s_checks_without_a_space(monkeypatch) -> None:
    # No nn.Linear modules (the matmuls are addmm calls of another module, as GPT-2's Conv1D):
    # the narrowed space leaves quantization out, and says why.
    agent, profile = precision_agent(AMX), _linear_heavy(linear_layers=0)
    narrowed = SearchSpace.load("default", "cpu").for_workload(_traits(profile))
    for space in (narrowed, None):  # without a space, the knob's own checks give the same reason
        text = " ".join(agent.diagnose(profile, space))
        assert SUGGESTED not in text
        assert "not searched here (quantized linear weights are for inference steps of models with linear" in text
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real_find_spec(name, *a)
    )
    assert f"(torchao): not searched here ({NO_TORCHAO})" in " ".join(agent.diagnose(_linear_heavy()))
    # On TPU quantization is no knob (TorchTPU has its own int8 path).
    tpu = type(agent)(load_definition("agents", "precision"), "tpu", None)
    assert "quantization is not a setting on tpu" in " ".join(tpu.diagnose(_linear_heavy()))
    # A profile without traits (older, or a stand-in) and no space: suggested as before.
    assert SUGGESTED in " ".join(agent.diagnose(_linear_heavy(linear_layers=None)))


def test_bf16_autocast_is_called_worth_trying_only_where_it_is_searched() -> None:
    agent, profile = precision_agent(AMX), _linear_heavy()
    searched = " ".join(agent.diagnose(profile, SearchSpace.load("precision", "cpu")))
    assert "bf16 autocast is worth trying" in searched and "should pay off" in searched
    fixed = SearchSpace.load("precision", "cpu")
    fixed = SearchSpace(fixed.name, "cpu", tuple(p for p in fixed.params if p.name != "autocast"))
    text = " ".join(agent.diagnose(profile, fixed))
    assert "worth trying" not in text and "bf16 autocast: not searched here" in text
    # Matmul precision is still searched (its medium is bf16 matmuls on this host): that is said.
    assert "bf16 matmuls (lower matmul precision) should pay off" in text


def test_compiler_fusion_is_suggested_only_where_a_compiling_mode_is_searched() -> None:
    agent = load_agents(["compile"], "cpu")[0]
    assert isinstance(agent, CompileAgent)
    overhead = decide(1e9, 1e8, 1.0, 300e9, "float32", 2e10, 100, 0.5, dispatch_seconds_per_op=6e-3)
    profile: Any = SimpleNamespace(  # a stand-in Profile: what diagnose reads
        verdict=overhead,
        operators=[],
        warmup=SimpleNamespace(first_call_seconds=0.01),
        timing=SimpleNamespace(median=1e-3),
        workload=SimpleNamespace(training=False),
    )
    assert "fusing ops with a compiler should cut dispatch time" in " ".join(
        agent.diagnose(profile, SearchSpace.load("default", "cpu"))
    )
    eager_only = " ".join(agent.diagnose(profile, SearchSpace.load("precision", "cpu")))
    assert "should cut dispatch time" not in eager_only
    assert "fusing ops with a compiler: not searched here (the search space 'precision'" in eager_only


@pytest.mark.parametrize("space_name", ["default", "precision"])
def test_fewer_threads_are_seeded_only_where_the_thread_count_is_searched(monkeypatch, space_name: str) -> None:
    pin_cores(monkeypatch, 8)
    (agent,) = load_agents(["threads"], "cpu")
    profile: Any = threads_profile(0.7, 200, 2e-3, 0.02)  # overhead-bound: a reason for fewer threads
    finding = agent.diagnose(profile, SearchSpace.load(space_name, "cpu"))[0]
    assert ("fewer threads are seeded" in finding) == (space_name == "default")
    assert ("fewer threads: not searched here" in finding) == (space_name == "precision")
