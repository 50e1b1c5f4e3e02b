"""The training-step knobs (issue 13, item 5): optimizer implementation and micro-batching.

The optimizer a trial's step runs is the one chosen (read back, and its kernels in the operator
table); the printed training-loop code runs; the accumulated gradient over k micro-batches equals
the whole batch's (fp32, 1e-6), in the step and in the accuracy guardrail; the step splits the
batch into k slices; the compile agent seeds and rejects them from the profile.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from tpu_tuner.core.errors import WorkloadError
from tpu_tuner.devices.cpu import CpuBackend
from tpu_tuner.execution.accuracy import REFERENCE, capture, relative_error
from tpu_tuner.execution.operators import OperatorTime
from tpu_tuner.execution.step import accumulate_gradients, micro_batches, prepare_step
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.tuned_config import TunedConfig, apply
from tpu_tuner.model.workloads.profiled import ProfiledWorkload
from tpu_tuner.model.workloads.workload import Workload
from tpu_tuner.tuning.agents import load_agents, training_step
from tpu_tuner.tuning.search.search_space import SearchSpace


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _workload(make_optimizer=None, batch_size: int = 8, loss_fn=nn.functional.cross_entropy) -> Workload:
    return Workload(
        name="mlp",
        source=Path("mlp.py"),
        build_model=Mlp,
        make_batch=lambda b, s: (torch.randn(b, 6), torch.randint(0, 3, (b,))),
        batch_size=batch_size,
        seq_len=None,
        convention="native",
        loss_fn=loss_fn,
        make_optimizer=make_optimizer,
    )


@pytest.mark.parametrize(
    ("value", "fused", "foreach"),
    [("default", None, None), ("forloop", None, False), ("foreach", None, True), ("fused", True, None)],
)
def test_the_step_runs_the_chosen_optimizer_implementation(value: str, fused, foreach) -> None:
    backend = CpuBackend()
    step = prepare_step(_workload(), backend, Candidate(optimizer_impl=value))
    assert isinstance(step.optimizer, torch.optim.AdamW)
    assert step.optimizer.defaults["fused"] == fused and step.optimizer.defaults["foreach"] == foreach
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step.run()
    names = {event.key for event in prof.key_averages()}
    # The implementation is observable in the operator table, as the compile agent reads it.
    assert any("_fused_adamw" in n for n in names) == (value == "fused")
    assert ("aten::_foreach_addcdiv_" in names) == (value == "foreach")  # fused uses _foreach_add_ only


def test_a_declared_optimizer_keeps_its_type_groups_and_settings() -> None:
    def make(params):
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3)

    step = prepare_step(_workload(make), CpuBackend(), Candidate(optimizer_impl="fused"))
    opt = step.optimizer
    assert type(opt) is torch.optim.SGD and opt.defaults["fused"] is True
    assert (opt.param_groups[0]["lr"], opt.param_groups[0]["momentum"], opt.param_groups[0]["weight_decay"]) == (
        0.05,
        0.9,
        1e-3,
    )
    assert sum(len(g["params"]) for g in opt.param_groups) == 4
    step.run()


def test_an_optimizer_without_the_flag_is_refused_in_one_line() -> None:
    with pytest.raises(
        WorkloadError,
        match="optimizer_impl fused: the model file's optimizer is Adagrad; only torch.optim Adam, AdamW, SGD",
    ):
        prepare_step(_workload(lambda p: torch.optim.Adagrad(p)), CpuBackend(), Candidate(optimizer_impl="fused"))


def _grads(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("k", [2, 4, 8])
def test_accumulated_gradients_equal_the_whole_batch_ones(k: int) -> None:
    """Mean-reduced loss, fp32: k micro-batches with loss / k give the whole batch's gradient and loss."""
    backend = CpuBackend()
    whole = prepare_step(_workload(), backend, Candidate())
    split = prepare_step(_workload(), backend, Candidate(micro_batches=str(k)))
    # One step's backward without the optimizer: the step's own accumulation, then read .grad.
    inputs, target = whole.batch
    loss_whole = accumulate_gradients(whole.loss, [(inputs, target)], torch.enable_grad)
    slices = micro_batches(*split.batch, k, _workload())
    assert len(slices) == k and all(s[0].shape[0] == 8 // k for s in slices)
    loss_split = accumulate_gradients(split.loss, slices, torch.enable_grad)
    assert torch.equal(whole.batch[0], split.batch[0])  # same seeded data and weights
    assert abs(loss_whole.item() - loss_split.item()) < 1e-6
    assert (_grads(whole.model) - _grads(split.model)).abs().max().item() < 1e-6


def test_the_guardrail_compares_accumulated_gradients() -> None:
    backend = CpuBackend()
    workload = _workload()
    reference = capture(prepare_step(workload, backend, REFERENCE), workload, backend, REFERENCE)
    candidate = Candidate(micro_batches="4")
    errors = relative_error(
        capture(prepare_step(workload, backend, candidate), workload, backend, candidate), reference
    )
    assert errors["gradients"] < 1e-6 and errors["loss"] < 1e-6
    # A sum-reduced loss does not average: 1/k is then wrong, and the guardrail sees it.
    summed = _workload(loss_fn=lambda out, y: nn.functional.cross_entropy(out, y, reduction="sum"))
    reference = capture(prepare_step(summed, backend, REFERENCE), summed, backend, REFERENCE)
    errors = relative_error(capture(prepare_step(summed, backend, candidate), summed, backend, candidate), reference)
    assert errors["gradients"] > 0.5


def test_the_step_runs_k_forwards_on_slices_of_the_batch() -> None:
    backend = CpuBackend()
    step = prepare_step(_workload(), backend, Candidate(micro_batches="4"))
    seen: list[int] = []
    step.model.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[0]))
    step.run()
    assert seen == [2, 2, 2, 2]


def test_a_batch_k_does_not_divide_is_refused() -> None:
    with pytest.raises(
        WorkloadError, match="micro_batches 4: the batch of 6 samples does not split into 4 equal parts"
    ):
        prepare_step(_workload(batch_size=6), CpuBackend(), Candidate(micro_batches="4"))


def test_printed_training_code_runs_and_apply_rebuilds_the_optimizer(tmp_path) -> None:
    config = TunedConfig(Candidate(optimizer_impl="fused", micro_batches="2"), "cpu")
    path = config.save(tmp_path / "tuned_config.toml")
    lines = config.instructions(path)
    start = next(i for i, line in enumerate(lines) if line.startswith("# in your training loop"))
    code = "\n".join(line.removeprefix("#   ") for line in lines[start + 1 :] if line.startswith("#   "))
    assert "fused=True" in code and "chunk(2)" in code
    assert "training_loss(inputs_i, target_i) / 2" in code
    torch.manual_seed(0)
    inputs, target = torch.randn(8, 6), torch.randint(0, 3, (8,))
    applied = apply(Mlp(), path)
    try:
        # As the printed instructions leave them: `applied`, and `model` the applied model.
        namespace = {
            "torch": torch,
            "applied": applied,
            "model": applied.model,
            "inputs": inputs,
            "target": target,
            "loss_fn": nn.functional.cross_entropy,
        }
        exec(compile(code, "printed", "exec"), namespace)
        assert namespace["optimizer"].defaults["fused"] is True
        assert namespace["optimizer"].state  # it stepped
        rebuilt = applied.optimizer(torch.optim.AdamW(applied.model.parameters(), lr=3e-4))
        assert rebuilt.defaults["fused"] is True and rebuilt.param_groups[0]["lr"] == 3e-4
        assert applied.micro_batches == 2
    finally:
        applied.restore()


def _profile(step: str, memory_share: float = 0.1, **shares: float) -> SimpleNamespace:
    return SimpleNamespace(
        workload=_profiled_workload(step),
        memory=SimpleNamespace(peak_bytes=int(memory_share * 2**30), method="test"),
        fitted_to_memory={},
        device=SimpleNamespace(memory_bytes=2**30),
        operators=[OperatorTime(name, 1.0, share * 10, share) for name, share in shares.items()],
    )


def test_the_compile_agent_seeds_and_rejects_the_optimizer_implementation() -> None:
    space = SearchSpace.load("default", "cpu")
    (agent,) = load_agents(["compile"], "cpu")
    heavy = _profile("training step", **{"aten::_foreach_addcdiv_": 0.15, "aten::addmm": 0.85})
    light = _profile("training step", **{"aten::_foreach_addcdiv_": 0.005, "aten::addmm": 0.995})
    assert {"optimizer_impl": "fused"} in agent.seeds(heavy, space)
    assert any("a fused optimizer is seeded" in line for line in training_step.findings(heavy))
    assert not any("optimizer_impl" in seed for seed in agent.seeds(light, space))
    # The update's profiler range, where the profile measured it, wins over the top operators:
    # a for-loop AdamW's small kernels never reach the top of the table.
    ranged = SimpleNamespace(**{**vars(light), "optimizer_share": 0.05})
    assert training_step.optimizer_share(ranged) == 0.05
    assert {"optimizer_impl": "fused"} in agent.seeds(ranged, space)
    inference = _profile("inference (forward)", **{"aten::addmm": 1.0})
    assert not any("optimizer_impl" in seed for seed in agent.seeds(inference, space))
    assert agent.validate(Candidate(optimizer_impl="fused")).startswith("optimizer_impl skipped")
    agent.seeds(heavy, space)
    assert agent.validate(Candidate(optimizer_impl="fused")) is None


def test_on_tpu_the_fused_adamw_is_offered_and_seeded() -> None:
    """torch-tpu 0.2.0 implements torch's fused AdamW for its device (docs/knobs.md, "Knobs of the
    training step"): the TPU space offers it beside the file's own optimizer (foreach there, torch's
    default on a PrivateUse1 device), and the compile agent seeds it as on CPU."""
    from tpu_tuner.knobs import registry as knobs

    def choices(name: str) -> list[str]:
        return SearchSpace.load(name, "tpu").grid()["optimizer_impl"]

    space = SearchSpace.load("default", "tpu")
    assert choices("default") == ["default", "fused"] and choices("torchtpu") == ["default", "fused"]
    assert knobs.get("optimizer_impl").applies_to("tpu")
    (agent,) = load_agents(["compile"], "tpu")
    heavy = _profile("training step", **{"aten::_foreach_addcdiv_": 0.15, "aten::addmm": 0.85})
    assert {"optimizer_impl": "fused"} in agent.seeds(heavy, space)


def test_the_memory_agent_seeds_micro_batching_only_near_the_memory_limit() -> None:
    from tpu_tuner.tuning.search.memory_limit import MemoryLimit

    space = SearchSpace.load("default", "cpu")
    (agent,) = load_agents(["memory"], "cpu")
    full, roomy = _profile("training step", memory_share=0.9), _profile("training step", memory_share=0.3)
    assert not any("micro_batches" in seed for seed in agent.seeds(full, space))  # CPU, no --trial-memory-gb
    agent.limit = MemoryLimit(2**30, "--trial-memory-gb")
    assert {"micro_batches": "2"} in agent.seeds(full, space)
    assert any("micro-batches" in line for line in agent.diagnose(full))
    assert not any("micro_batches" in seed for seed in agent.seeds(roomy, space))
    assert agent.validate(Candidate(micro_batches="2")) is None
    agent.diagnose(_profile("inference (forward)"))
    assert agent.validate(Candidate(micro_batches="2")).startswith("micro_batches skipped: an inference step")


def test_the_profile_measures_the_optimizer_update_from_its_profiler_range(fast_settings) -> None:
    from pathlib import Path

    from tpu_tuner.profiling import profile

    fixtures = Path(__file__).parent / "fixtures"
    trained = profile(fixtures / "tiny_gpt.py", settings=fast_settings)
    assert trained.workload["step"].startswith("training")
    assert trained.optimizer_share is not None and 0.0 < trained.optimizer_share < 1.0
    assert trained.workload["traits"]["training"] is True
    inference = profile(fixtures / "tiny_mlp_benchmark.py", settings=fast_settings)
    assert inference.optimizer_share is None and inference.workload["traits"]["training"] is False


def _profiled_workload(step: str) -> ProfiledWorkload:
    """A profiled workload whose step reads `step`, as profile.json writes it."""
    return ProfiledWorkload.from_dict({"name": "m", "source": "m.py", "convention": "native", "step": step})


def test_micro_batches_under_torchtpu_compile_are_refused_unmeasured_on_tpu_only() -> None:
    """On a v5e chip, accumulation under torch.compile(backend="tpu") failed every step after the
    first ("a required argument is in a failed state") after a compile of up to 145 s: refused up
    front there, with its cause; eager accumulation and a compiled single batch still run."""
    (tpu,) = load_agents(["memory"], "tpu")
    tpu.diagnose(_profile("training step"))
    refusal = tpu.validate(Candidate(execution="tpu", micro_batches="2"))
    assert refusal is not None and "failed state" in refusal and "micro_batches 2" in refusal
    assert tpu.validate(Candidate(execution="tpu")) is None
    assert tpu.validate(Candidate(execution="eager:defer_and_fuse", micro_batches="2")) is None
    (cpu,) = load_agents(["memory"], "cpu")
    cpu.diagnose(_profile("training step"))
    assert cpu.validate(Candidate(execution="inductor", micro_batches="2")) is None
