"""Activation checkpointing of repeated blocks, and the study's memory constraint.

The knob wraps the blocks the model's structure repeats (recomputed in backward: observable as a
second forward of each checkpointed block's insides), leaves the gradients unchanged, prints
runnable code; a trial over the memory limit is infeasible with its reason; the memory agent
seeds the knob only near the limit and skips it for inference.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import optuna
import pytest
import torch
from torch import nn

from tpu_tuner.core.errors import WorkloadError
from tpu_tuner.devices.cpu import CpuBackend
from tpu_tuner.execution.measurement import Measurement
from tpu_tuner.knobs import registry as knobs
from tpu_tuner.knobs.activation_checkpointing import checkpoint_blocks
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.model.workloads.blocks import repeated_blocks
from tpu_tuner.model.workloads.profiled import ProfiledWorkload
from tpu_tuner.studies import records
from tpu_tuner.tuning.agents import load_agents
from tpu_tuner.tuning.search import trial_attrs
from tpu_tuner.tuning.search.memory_limit import MemoryLimit, memory_limit
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.search.tuning_trial import TuningTrial

GiB = 2**30


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.linear(self.norm(x)))


class Stack(nn.Module):
    """Three repeated blocks and a head (a Sequential of two Linear layers: leaves, not blocks)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _forward_counts(model: Stack, inputs: torch.Tensor) -> list[int]:
    """How often each block's inner Linear ran in one forward + backward."""
    counts = [0] * len(model.blocks)
    for i, block in enumerate(model.blocks):
        block.linear.register_forward_pre_hook(lambda module, args, i=i: counts.__setitem__(i, counts[i] + 1))
    model(inputs).sum().backward()
    return counts


@pytest.mark.parametrize(("value", "expected"), [("none", [1, 1, 1]), ("blocks", [2, 2, 2]), ("every_2nd", [2, 1, 2])])
def test_checkpointed_blocks_are_recomputed_in_backward(value: str, expected: list[int]) -> None:
    backend = CpuBackend()
    model = Candidate(activation_checkpointing=value).prepare_model(Stack(), backend)
    assert repeated_blocks(model) == list(model.blocks)  # the head's Linear layers are no blocks
    assert _forward_counts(model, torch.randn(4, 8)) == expected
    assert knobs.get("activation_checkpointing").observe(model, model, backend) == value
    seen: list[int] = []
    model.blocks[0].linear.register_forward_pre_hook(lambda module, args: seen.append(1))
    with torch.no_grad():  # inference: nothing is saved for backward, the block runs plainly
        model(torch.randn(4, 8))
    assert seen == [1]


def test_gradients_equal_the_unwrapped_models() -> None:
    torch.manual_seed(0)
    reference = Stack()
    wrapped = checkpoint_blocks(copy.deepcopy(reference))
    inputs = torch.randn(5, 8)
    reference(inputs).square().sum().backward()
    wrapped(inputs).square().sum().backward()
    for (name, a), b in zip(reference.named_parameters(), wrapped.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=0, atol=1e-6), name
    assert set(reference.state_dict()) == set(wrapped.state_dict())  # checkpoints still load


def test_a_model_without_repeated_blocks_is_refused_with_the_reason() -> None:
    with pytest.raises(WorkloadError, match="needs repeated blocks .* and Sequential has none"):
        checkpoint_blocks(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)))
    assert knobs.get("activation_checkpointing").applies_to("tpu")  # torch-tpu keeps the recomputation


def test_printed_code_runs_and_checkpoints_the_blocks() -> None:
    code = "\n".join(Candidate(activation_checkpointing="blocks").code("cpu"))
    assert "checkpoint_blocks(model, every=1)" in code
    script = (
        textwrap.dedent("""\
        import copy, json
        import torch
        from torch import nn
        from tpu_tuner.knobs.registry import get

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = nn.Linear(8, 8)

            def forward(self, x):
                return x + torch.tanh(self.linear(x))

        torch.manual_seed(0)
        model = nn.Sequential(Block(), Block())
        reference = copy.deepcopy(model)
        inputs = torch.randn(3, 8)
        """)
        + code
        + textwrap.dedent("""
        with torch.autocast("cpu", enabled=False):
            output = model(inputs)
        output.sum().backward()
        reference(inputs).sum().backward()
        pairs = zip(model.parameters(), reference.parameters())
        same = all(torch.allclose(a.grad, b.grad, atol=1e-6) for a, b in pairs)
        print(json.dumps({"observed": get("activation_checkpointing").observe(model, model, None), "same": same}))
        """)
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"observed": "blocks", "same": True}


def _measurement(peak_bytes: int | None, error: float = 0.0) -> Measurement:
    return Measurement(
        candidate={},
        step_median=0.01,
        step_p10=0.01,
        step_p90=0.01,
        samples=[0.01],
        first_call_seconds=0.0,
        warmup_seconds=0.0,
        compile_seconds=0.0,
        compiles={},
        model_flops_per_step=1e9,
        peak_flops_per_s=1e12,
        peak_dtype="float32",
        mfu=0.1,
        peak_memory_bytes=peak_bytes,
        accuracy_errors={"out": error},
    )


def test_a_trial_over_the_memory_limit_is_infeasible_with_the_reason() -> None:
    limit = memory_limit(2 * GiB, "cpu", None)
    assert limit == MemoryLimit(2 * GiB, "--trial-memory-gb")
    study = optuna.create_study()
    over, under = study.ask(), study.ask()
    trial_attrs.record_measurement(over, _measurement(3 * GiB), 100, 1e-3, memory=limit)
    trial_attrs.record_measurement(under, _measurement(1 * GiB), 100, 1e-3, memory=limit)
    study.tell(over, 0.01)
    study.tell(under, 0.02)
    over_t, under_t = study.trials
    assert not TuningTrial.of(over_t).is_feasible and TuningTrial.of(under_t).is_feasible
    assert records.attrs(over_t)["failure_kind"] == "memory"
    assert records.attrs(over_t)["failure_message"] == "peak memory 3 GiB > 2 GiB (--trial-memory-gb)"
    assert over_t.constraints["memory"] == GiB and under_t.constraints["memory"] == -GiB
    # A repeat carries the constraint, as it carries the accuracy one.
    repeat = study.ask()
    trial_attrs.copy_attrs(over_t, repeat, 1e-3)
    study.tell(repeat, 0.01)
    assert study.trials[-1].constraints["memory"] == GiB
    assert not TuningTrial.of(study.trials[-1]).is_feasible


def test_the_limit_is_the_users_or_the_device_memory_and_none_on_cpu_without_one() -> None:
    assert memory_limit(None, "cpu", 24 * GiB) is None
    assert memory_limit(None, "cuda", 80 * GiB) == MemoryLimit(80 * GiB, "the device's memory")
    assert memory_limit(None, "tpu", 32 * GiB) == MemoryLimit(32 * GiB, "the device's memory")
    assert memory_limit(4 * GiB, "cuda", 80 * GiB) == MemoryLimit(4 * GiB, "--trial-memory-gb")


def _profile(peak_bytes: int, training: bool = True, fitted: dict[str, str] | None = None) -> SimpleNamespace:
    step = "training step" if training else "inference (forward)"
    return SimpleNamespace(
        workload=_profiled_workload(step),
        memory=SimpleNamespace(peak_bytes=peak_bytes, method="VmHWM"),
        fitted_to_memory=fitted or {},
    )


def _memory_agent(limit: MemoryLimit | None):
    (agent,) = load_agents(["memory"], "cpu")
    agent.limit = limit
    return agent


def test_memory_agent_seeds_checkpointing_only_near_the_limit() -> None:
    space = SearchSpace.load("default", "cpu")
    limit = MemoryLimit(4 * GiB, "--trial-memory-gb")
    near = _memory_agent(limit)
    # Micro-batching, the other memory knob of a training step, is seeded alone beside it.
    assert near.seeds(_profile(int(3.6 * GiB)), space) == [
        {"activation_checkpointing": "blocks"},
        {"micro_batches": "2"},
    ]
    findings = near.diagnose(_profile(int(3.6 * GiB)))
    assert findings[0] == "baseline peak memory 3.6 GiB (VmHWM); limit 4 GiB (--trial-memory-gb), 90% of it"
    assert "seeded" in findings[1]
    assert _memory_agent(limit).seeds(_profile(1 * GiB), space) == []
    no_limit = _memory_agent(None)
    assert no_limit.seeds(_profile(20 * GiB), space) == []
    assert "no memory limit on this device" in no_limit.diagnose(_profile(1 * GiB))[0]


def test_a_fitted_step_seeds_its_recompute_traded_for_micro_batches() -> None:
    """On the chip the 335M decoder, fitted to memory with checkpointed blocks, reached 28.9% MFU
    with bf16 parameters and checkpointing kept: the memory agent seeds half the recompute, then
    no checkpointing with 4 or 2 micro-batches (no forward recomputed), and says so."""
    fitted = _profile(int(3.9 * GiB), fitted={"activation_checkpointing": "blocks"})
    space = SearchSpace.load("default", "tpu").starting_from(fitted.fitted_to_memory)
    agent = _memory_agent(MemoryLimit(4 * GiB, "the device's memory"))
    assert agent.seeds(fitted, space) == [
        {"activation_checkpointing": "every_2nd"},
        {"activation_checkpointing": "none", "micro_batches": "4"},
        {"activation_checkpointing": "none", "micro_batches": "2"},
    ]
    assert "fitted to memory with checkpointing" in agent.diagnose(fitted, space)[1]
    # Fitted with micro-batches alone (no recompute to trade), the rule near the limit stands.
    split = _profile(int(3.9 * GiB), fitted={"micro_batches": "2"})
    assert agent.seeds(split, space)[0] == {"activation_checkpointing": "blocks"}


def test_memory_agent_skips_checkpointing_for_inference() -> None:
    agent = _memory_agent(MemoryLimit(4 * GiB, "--trial-memory-gb"))
    assert agent.seeds(_profile(int(3.9 * GiB), training=False), SearchSpace.load("default", "cpu")) == []
    assert "inference step" in agent.diagnose(_profile(int(3.9 * GiB), training=False))[1]
    assert "inference step keeps no activations" in agent.validate(Candidate(activation_checkpointing="blocks"))
    assert agent.validate(Candidate()) is None


def test_memory_agent_tries_checkpointing_only_under_memory_pressure() -> None:
    # Far from the limit, or with none, checkpointing can only cost time: rejected unmeasured.
    for limit, peak in ((None, GiB), (MemoryLimit(4 * GiB, "--trial-memory-gb"), GiB)):
        relaxed = _memory_agent(limit)
        assert "checkpointing is not tried" in relaxed.diagnose(_profile(peak))[-1]
        assert "not near a memory limit" in relaxed.validate(Candidate(activation_checkpointing="every_2nd"))
        assert relaxed.validate(Candidate(micro_batches="2")) is None  # searched: it can also run faster
    pressed = _memory_agent(MemoryLimit(4 * GiB, "--trial-memory-gb"))
    pressed.diagnose(_profile(int(3.6 * GiB)))
    assert pressed.validate(Candidate(activation_checkpointing="every_2nd")) is None


def _profiled_workload(step: str) -> ProfiledWorkload:
    """A profiled workload whose step reads `step`, as profile.json writes it."""
    return ProfiledWorkload.from_dict({"name": "m", "source": "m.py", "convention": "native", "step": step})
