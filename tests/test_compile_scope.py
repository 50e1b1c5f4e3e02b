"""The `compile_scope` knob: the loss compiled with the model as one graph (training steps).

Its loss runs inside the compiled graph (the Python loss function runs while dynamo traces, not
on every step); its gradients match the eager fp32 reference; it means nothing under eager
execution or on an inference step; `tpu_tuner.apply` and the printed loop compute the loss as the
trial did; the compile agent seeds it where the loss's kernels take a noticeable share.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn
from torch._dynamo import register_backend

from tpu_tuner.devices.cpu import CpuBackend
from tpu_tuner.execution.accuracy import REFERENCE, capture, relative_error
from tpu_tuner.execution.operators import OperatorTime
from tpu_tuner.execution.step import prepare_step
from tpu_tuner.knobs import registry as knobs
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.traits import WorkloadTraits
from tpu_tuner.knobs.tuned_config import TunedConfig, apply
from tpu_tuner.model.workloads.profiled import ProfiledWorkload
from tpu_tuner.model.workloads.workload import Workload
from tpu_tuner.tuning.agents import load_agents, loss_scope
from tpu_tuner.tuning.search.search_space import SearchSpace

COMPILED_LOSS = Candidate(execution="aot_eager", compile_scope="model+loss")


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


GRAPHS: list[torch.fx.GraphModule] = []


@register_backend
def recording(graph: torch.fx.GraphModule, example_inputs: list) -> object:
    """A torch.compile backend that keeps the graphs dynamo hands it and runs them as they are."""
    GRAPHS.append(graph)
    return graph.forward


def _compiled_calls(candidate: Candidate) -> set[object]:
    """The callables in the graphs dynamo captured over two steps of `candidate`."""
    GRAPHS.clear()
    torch._dynamo.reset()
    step = prepare_step(_workload(nn.functional.cross_entropy), CpuBackend(), candidate)
    step.run()
    step.run()
    return {node.target for graph in GRAPHS for node in graph.graph.nodes if node.op == "call_function"}


def _workload(loss_fn) -> Workload:
    return Workload(
        name="mlp",
        source=Path("mlp.py"),
        build_model=_mlp,
        make_batch=lambda b, s: (torch.randn(b, 6), torch.randint(0, 3, (b,))),
        batch_size=8,
        seq_len=None,
        convention="native",
        loss_fn=loss_fn,
    )


def test_the_loss_runs_inside_the_compiled_graph() -> None:
    loss_in_graph = nn.functional.cross_entropy
    assert loss_in_graph in _compiled_calls(Candidate(execution="recording", compile_scope="model+loss"))
    assert loss_in_graph not in _compiled_calls(Candidate(execution="recording"))  # the model alone
    assert torch.tanh in _compiled_calls(Candidate(execution="recording"))
    # Under eager there is nothing to compile the loss into: the knob is inactive there.
    assert _compiled_calls(Candidate(compile_scope="model+loss")) == set()
    knob = knobs.get("compile_scope")
    eager = prepare_step(_workload(nn.functional.cross_entropy), CpuBackend(), Candidate(compile_scope="model+loss"))
    assert knob.observe_training(eager.optimizer, 1, eager.loss) == "model"


def test_its_gradients_match_the_eager_reference() -> None:
    workload, backend = _workload(nn.functional.cross_entropy), CpuBackend()
    reference = capture(prepare_step(workload, backend, REFERENCE), workload, backend, REFERENCE)
    for candidate in (COMPILED_LOSS, Candidate(execution="aot_eager", compile_scope="model+loss", micro_batches="2")):
        errors = relative_error(
            capture(prepare_step(workload, backend, candidate), workload, backend, candidate), reference
        )
        assert errors["loss"] < 1e-6 and errors["gradients"] < 1e-6, (candidate, errors)


def test_the_space_searches_it_for_training_steps_under_a_compiling_execution() -> None:
    space = SearchSpace.load("default", "cpu")
    knob = knobs.get("compile_scope")
    assert knob.active({"execution": "inductor"}) and knob.active({"execution": "aot_eager"})
    assert not knob.active({"execution": "eager"}) and not knob.active({})
    traits = {"conv_weights": 0, "repeated_blocks": 0, "batch_size": 8}
    training = {p.name: p.choices for p in space.for_workload(WorkloadTraits(training=True, **traits)).params}
    assert training["compile_scope"] == ("model", "model+loss")
    inference = space.for_workload(WorkloadTraits(training=False, **traits))
    assert {p.name: p.choices for p in inference.params}["compile_scope"] == ("model",)
    assert any(line.startswith("compile_scope: an inference step has no loss") for line in inference.left_out)


def test_apply_and_the_printed_loop_compute_the_loss_as_the_trial_did(tmp_path) -> None:
    config = TunedConfig(COMPILED_LOSS, "cpu")
    path = config.save(tmp_path / "tuned_config.toml")
    lines = config.instructions(path)
    start = next(i for i, line in enumerate(lines) if line.startswith("# in your training loop"))
    code = "\n".join(line.removeprefix("#   ") for line in lines[start + 1 :] if line.startswith("#   "))
    assert "applied.training_loss(loss_fn)" in code
    torch.manual_seed(0)
    inputs, target = torch.randn(8, 6), torch.randint(0, 3, (8,))
    applied = apply(_mlp(), path)
    try:
        loss_fn = nn.functional.cross_entropy
        namespace = {"applied": applied, "inputs": inputs, "target": target, "loss_fn": loss_fn, "torch": torch}
        exec(compile(code, "printed", "exec"), namespace)
        training_loss = namespace["training_loss"]
        assert torch.allclose(training_loss(inputs, target), loss_fn(applied.model(inputs), target))
        assert knobs.get("compile_scope").observe_training(None, 1, training_loss) == "model+loss"
    finally:
        applied.restore()


def _profile(step: str, **shares: float) -> SimpleNamespace:
    workload = ProfiledWorkload.from_dict({"name": "m", "source": "m.py", "convention": "native", "step": step})
    operators = [OperatorTime(name, 1.0, share * 10, share) for name, share in shares.items()]
    return SimpleNamespace(workload=workload, operators=operators, optimizer_share=0.0)


def test_the_compile_agent_seeds_it_where_the_loss_is_a_noticeable_share() -> None:
    space = SearchSpace.load("default", "cpu")
    (agent,) = load_agents(["compile"], "cpu")
    # examples/llama.py's baseline profile: the loss's two kernels took 2.5% and 2.3%.
    heavy = _profile("training step", **{"aten::_log_softmax": 0.025, "aten::_log_softmax_backward_data": 0.023})
    light = _profile("training step", **{"aten::nll_loss_forward": 0.01, "aten::addmm": 0.99})
    inference = _profile("inference (forward)", **{"aten::_log_softmax": 0.5})
    assert {"execution": "inductor", "compile_scope": "model+loss"} in agent.seeds(heavy, space)
    assert any("compiling the loss with the model (one graph) is seeded" in line for line in loss_scope.findings(heavy))
    for profile in (light, inference):
        assert not any("compile_scope" in seed for seed in agent.seeds(profile, space))
