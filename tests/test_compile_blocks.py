"""`compile_scope = blocks`: each repeated block compiled on its own (regional compilation).

The blocks are compiled, nothing outside them is, and like blocks share one graph (one program to
compile for all of them, not one as deep as the model); the gradients match
the eager fp32 reference, with checkpointed blocks too; the knob and the execution knob read the
setting back on the trial path, the apply path and from the printed code; the TPU space offers it
only where the model has like blocks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch._dynamo import register_backend

from tpu_tuner.core.errors import WorkloadError
from tpu_tuner.devices.cpu import CpuBackend
from tpu_tuner.execution.accuracy import REFERENCE, capture, relative_error
from tpu_tuner.execution.step import prepare_step
from tpu_tuner.knobs import registry as knobs
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.compile_scope import compile_blocks
from tpu_tuner.knobs.traits import WorkloadTraits
from tpu_tuner.knobs.tuned_config import TunedConfig, apply
from tpu_tuner.model.workloads.workload import Workload
from tpu_tuner.tuning.search.search_space import SearchSpace

GRAPHS: list[torch.fx.GraphModule] = []


@register_backend
def block_recording(graph: torch.fx.GraphModule, example_inputs: list) -> object:
    """A torch.compile backend that keeps the graphs dynamo hands it and runs them as they are."""
    GRAPHS.append(graph)
    return graph.forward


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


class Stack(nn.Module):
    """An embedding-like input layer, four like blocks and a head that uses `torch.sigmoid`, an
    operator no block uses: it must stay out of every compiled graph."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(torch.sigmoid(h))


def _workload() -> Workload:
    return Workload(
        name="stack",
        source=Path("stack.py"),
        build_model=Stack,
        make_batch=lambda b, s: (torch.randn(b, 6), torch.randint(0, 3, (b,))),
        batch_size=8,
        seq_len=None,
        convention="native",
        loss_fn=nn.functional.cross_entropy,
    )


BLOCKS = Candidate(execution="block_recording", compile_scope="blocks")


def _targets(graph: torch.fx.GraphModule) -> list[object]:
    return [node.target for node in graph.graph.nodes if node.op == "call_function"]


def test_each_block_is_compiled_on_its_own_and_nothing_else() -> None:
    GRAPHS.clear()
    torch._dynamo.reset()
    step = prepare_step(_workload(), CpuBackend(), BLOCKS)
    step.run()
    step.run()
    # One graph, a block's (two linears, no head): dynamo's guards hold for every like block, so
    # the four share it; none again at step 2.
    assert len(GRAPHS) == 1
    assert _targets(GRAPHS[0]).count(nn.functional.linear) == 2 and torch.sigmoid not in _targets(GRAPHS[0])
    assert knobs.get("compile_scope").observe(step.model, step.forward, CpuBackend()) == "blocks"
    assert knobs.get("execution").observe(step.model, step.forward, CpuBackend()) == "block_recording"
    # The whole model as one graph: one graph holding the head's operator.
    GRAPHS.clear()
    torch._dynamo.reset()
    whole = prepare_step(_workload(), CpuBackend(), Candidate(execution="block_recording"))
    whole.run()
    assert len(GRAPHS) == 1 and torch.sigmoid in _targets(GRAPHS[0])
    assert knobs.get("compile_scope").observe(whole.model, whole.forward, CpuBackend()) is None


@pytest.mark.parametrize("checkpointing", ["none", "blocks", "every_2nd"])
def test_its_gradients_match_the_eager_reference(checkpointing: str) -> None:
    workload, backend = _workload(), CpuBackend()
    reference = capture(prepare_step(workload, backend, REFERENCE), workload, backend, REFERENCE)
    candidate = Candidate(execution="aot_eager", compile_scope="blocks", activation_checkpointing=checkpointing)
    step = prepare_step(workload, backend, candidate)
    errors = relative_error(capture(step, workload, backend, candidate), reference)
    assert errors["loss"] < 1e-6 and errors["gradients"] < 1e-6, errors


def test_the_eager_step_and_the_memory_estimate_run_the_blocks_eagerly() -> None:
    """The step's eager twin (FLOP counting) and the memory estimate (fake tensors) call the
    compiled blocks: they must not compile them (a TPU backend on a CPU's fake tensors)."""
    from tpu_tuner.execution.memory_estimate import estimate_step_memory

    GRAPHS.clear()
    torch._dynamo.reset()
    step = prepare_step(_workload(), CpuBackend(), BLOCKS)
    step.run_eager()
    assert GRAPHS == []
    estimate = estimate_step_memory(_workload(), CpuBackend(), BLOCKS)
    assert GRAPHS == [] and estimate.peak_bytes, estimate
    step.run()
    assert len(GRAPHS) == 1  # the step itself still compiles its blocks


def test_eager_execution_leaves_it_inactive() -> None:
    step = prepare_step(_workload(), CpuBackend(), Candidate(compile_scope="blocks"))
    assert step.forward is step.model or not hasattr(step.forward, "_orig_mod")
    assert knobs.get("compile_scope").observe(step.model, step.forward, CpuBackend()) is None
    assert not knobs.get("compile_scope").active({"execution": "eager"})


def test_a_model_without_like_blocks_is_refused_in_words() -> None:
    with pytest.raises(WorkloadError, match="compile_scope = blocks needs two or more like blocks"):
        compile_blocks(nn.Sequential(nn.Linear(2, 2), nn.Tanh()), backend="aot_eager")


def test_apply_and_the_printed_code_compile_the_blocks_as_the_trial_did(tmp_path) -> None:
    candidate = Candidate(execution="aot_eager", compile_scope="blocks")
    code = "\n".join(candidate.code("cpu", training=False))
    assert "compile_blocks(model)" in code
    namespace: dict[str, object] = {"model": Stack(), "inputs": torch.randn(2, 6)}
    exec(compile(code, "printed", "exec"), namespace)
    printed = namespace["model"]
    assert knobs.get("compile_scope").observe(printed, printed, CpuBackend()) == "blocks"
    assert knobs.get("execution").observe(printed, printed, CpuBackend()) == "aot_eager"
    path = TunedConfig(candidate, "cpu").save(tmp_path / "tuned_config.toml")
    applied = apply(Stack(), path)
    try:
        assert knobs.get("compile_scope").observe(applied.model, applied.model, CpuBackend()) == "blocks"
        assert knobs.get("execution").observe(applied.model, applied.model, CpuBackend()) == "aot_eager"
        assert applied.model(torch.randn(2, 6)).shape == (2, 3)
    finally:
        applied.restore()


def test_the_tpu_space_offers_it_where_the_model_has_like_blocks() -> None:
    space = SearchSpace.load("default", "tpu")

    def choices(training: bool, blocks: int) -> tuple[str, ...]:
        traits = WorkloadTraits(training=training, conv_weights=0, repeated_blocks=blocks, batch_size=8)
        return {p.name: p.choices for p in space.for_workload(traits).params}.get("compile_scope", ())

    assert choices(True, 16) == ("model", "model+loss", "blocks", "step")
    assert choices(False, 16) == ("model", "blocks")  # an inference step: no loss to compile, no step to trace
    assert choices(True, 0) == ("model", "model+loss", "step")
    assert choices(False, 0) in ((), ("model",))  # nothing to choose: left out
    cpu = {p.name: p.choices for p in SearchSpace.load("default", "cpu").params}
    assert "blocks" not in cpu["compile_scope"] and "step" not in cpu["compile_scope"]  # not measured there


@pytest.mark.parametrize(
    ("checkpointing", "before_every_n_layers"), [("none", False), ("every_2nd", False), ("every_2nd", True)]
)
def test_a_transformers_decoder_compiles_one_graph_for_all_its_layers(
    checkpointing: str, before_every_n_layers: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten layers, past dynamo's recompile limit (8): a layer guarding on its index (a KV cache's
    `layer_idx`) would recompile per layer and leave the last ones eager; tpu-tune's hf models run
    without a cache, so one graph serves all ten, under transformers' own checkpointing too (its
    `activation_checkpointing_enable`, or the layers' own flags of transformers 5.17, the chip's)."""
    pytest.importorskip("transformers")
    from tpu_tuner.knobs import activation_checkpointing
    from tpu_tuner.model.workloads.loader import load_workload

    if before_every_n_layers:
        monkeypatch.setattr(activation_checkpointing, "takes_every_n_layers", lambda model: False)

    workload = load_workload(
        "hf:llama?hidden_size=64,intermediate_size=128,num_hidden_layers=10,num_attention_heads=4,"
        "num_key_value_heads=2,vocab_size=256"
    )
    backend = CpuBackend()
    reference = capture(prepare_step(workload, backend, REFERENCE, 2, 16), workload, backend, REFERENCE)
    GRAPHS.clear()
    torch._dynamo.reset()
    candidate = Candidate(execution="block_recording", compile_scope="blocks", activation_checkpointing=checkpointing)
    step = prepare_step(workload, backend, candidate, 2, 16)
    errors = relative_error(capture(step, workload, backend, candidate), reference)
    assert errors["loss"] < 1e-5 and errors["gradients"] < 1e-5, errors
    assert len(GRAPHS) == 1
    assert knobs.get("compile_scope").observe(step.model, step.forward, backend) == "blocks"
