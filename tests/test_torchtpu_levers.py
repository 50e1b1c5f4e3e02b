"""TorchTPU's levers as knobs (xla_optimization_level, libtpu_flags, param_dtype), against a
stand-in ``torch.tpu`` where they reach TorchTPU (the default environment has no torch-tpu; the
names are checked against the real package by tests/test_torchtpu_contract.py). The attention
kernel's tests are in tests/test_torchtpu_levers_attention.py."""

from __future__ import annotations

import contextlib
import dataclasses
import types
from pathlib import Path

import pytest
import torch
from torch import nn

from tpu_tuner.devices.cpu import CpuBackend
from tpu_tuner.devices.torchtpu import TorchTpuBackend
from tpu_tuner.execution.accuracy import REFERENCE, capture, relative_error
from tpu_tuner.execution.step import prepare_step
from tpu_tuner.knobs import registry as knobs
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.capabilities import NarrowedByWorkload
from tpu_tuner.knobs.libtpu_flags import in_force, with_flags
from tpu_tuner.knobs.tuned_config import TunedConfig
from tpu_tuner.model.workloads.workload import Workload


@pytest.fixture
def pushes(monkeypatch) -> list:
    """A stand-in ``torch.tpu.compiler.custom_compiler_options`` recording ("push", options) and
    ("pop",) as torch-tpu 0.2.0's pushes and pops them."""
    record: list = []

    @contextlib.contextmanager
    def custom_compiler_options(options):
        record.append(("push", dict(options)))
        try:
            yield
        finally:
            record.append(("pop",))

    tpu = types.SimpleNamespace(compiler=types.SimpleNamespace(custom_compiler_options=custom_compiler_options))
    monkeypatch.setattr(torch, "tpu", tpu, raising=False)
    return record


# --- xla_optimization_level ---------------------------------------------------------------------


def test_the_level_is_pushed_for_the_trial_and_popped_after(pushes) -> None:
    knob = knobs.get("xla_optimization_level")
    backend = CpuBackend()  # the hook asks torch.tpu, not the backend
    with knob.process("O2", backend):
        assert pushes == [("push", {"xla_optimization_level": "O2"})]
        assert knob.observe(nn.Linear(1, 1), nn.Linear(1, 1), backend) == "O2"
    assert pushes[-1] == ("pop",)
    assert knob.observe(nn.Linear(1, 1), nn.Linear(1, 1), backend) == "default"
    with knob.process("default", backend):
        pass
    assert len(pushes) == 2  # the default pushes nothing: the compiler's own level


def test_the_level_is_a_tpu_setting_of_the_candidate(pushes, tmp_path) -> None:
    candidate = Candidate(xla_optimization_level="o1")  # XLA's spelling is O1
    assert candidate["xla_optimization_level"] == "O1"
    with candidate.process(CpuBackend()):
        assert pushes == []  # not a knob on CPU
    assert "XLA optimization level O1" in candidate.describe()
    assert knobs.get("xla_optimization_level").label("O1") == "xla_optimization_level=O1"
    code = "\n".join(candidate.code("tpu"))
    assert 'torch.tpu.compiler.custom_compiler_options({"xla_optimization_level": "O1"})' in code
    loaded = TunedConfig.load(TunedConfig(candidate, "tpu").save(tmp_path / "tuned_config.toml"))
    assert loaded.candidate == candidate


@pytest.mark.parametrize("bad", ["O4", "fast", ""])
def test_a_bad_level_is_refused_in_one_line_naming_the_knob(bad: str) -> None:
    with pytest.raises(ValueError, match=r"^xla_optimization_level must be one of default, O0, O1, O2, O3"):
        knobs.get("xla_optimization_level").check(bad)


# --- libtpu_flags -------------------------------------------------------------------------------


def test_a_flag_set_is_appended_to_the_users_own_flags(monkeypatch) -> None:
    knob = knobs.get("libtpu_flags")
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_user_flag=1")
    env = knob.environment("vmem_dense", TorchTpuBackend)
    assert env == {"LIBTPU_INIT_ARGS": "--xla_user_flag=1 --xla_tpu_scoped_vmem_limit_kib=98304"}
    assert Candidate(libtpu_flags="vmem_dense").environment(TorchTpuBackend) == env
    assert Candidate(libtpu_flags="vmem_dense").environment(CpuBackend) == {}  # a TPU knob only
    assert knob.environment("default", TorchTpuBackend) == {}
    # Set as the tuned config says, the variable already holds the set: the same value again, so
    # `tpu_tuner.apply` finds nothing missing.
    monkeypatch.setenv("LIBTPU_INIT_ARGS", env["LIBTPU_INIT_ARGS"])
    assert knob.environment("vmem_dense", TorchTpuBackend) == env
    assert knob.observe(nn.Linear(1, 1), nn.Linear(1, 1), TorchTpuBackend) == "vmem_dense"


def test_a_users_flag_of_the_same_name_gives_way_to_the_set(caplog) -> None:
    merged = with_flags("--a=1 --xla_tpu_scoped_vmem_limit_kib=16384", ("--xla_tpu_scoped_vmem_limit_kib=81920",))
    assert merged == "--a=1 --xla_tpu_scoped_vmem_limit_kib=81920"
    assert "replaced" in caplog.text
    assert in_force(merged) == "vmem_moe" and in_force("--a=1") == "default"


def test_flag_sets_are_words_and_code_and_refused_when_unknown() -> None:
    knob = knobs.get("libtpu_flags")
    assert knob.describe("no_bundle_cost_model") == "libtpu flags no_bundle_cost_model"
    assert "--xla_tpu_use_bundle_aware_cost_model_for_fusions=false" in knob.code("no_bundle_cost_model", "tpu")[0]
    with pytest.raises(ValueError, match=r"^libtpu_flags must be one of default, vmem_dense"):
        knob.check("--xla_tpu_anything=1")


# --- param_dtype --------------------------------------------------------------------------------


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
        self.register_buffer("scale", torch.ones(3))  # a floating buffer: cast with the parameters

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) * self.scale


def _workload() -> Workload:
    return Workload(
        name="mlp",
        source=Path("mlp.py"),
        build_model=Mlp,
        make_batch=lambda b, s: (torch.randn(b, 6), torch.randint(0, 3, (b,))),
        batch_size=8,
        seq_len=None,
        convention="native",
        loss_fn=nn.functional.cross_entropy,
    )


def test_bf16_parameters_come_before_the_optimizer_so_its_states_are_bf16() -> None:
    backend = CpuBackend()
    candidate = Candidate(param_dtype="bfloat16")
    step = prepare_step(_workload(), backend, candidate)
    assert {p.dtype for p in step.model.parameters()} == {torch.bfloat16}
    assert step.forward(torch.randn(2, 6)).dtype == torch.float32  # the user's code sees float32 out
    step.run()
    states = [t for state in step.optimizer.state.values() for t in state.values() if t.dim() > 0]
    assert states and {t.dtype for t in states} == {torch.bfloat16}
    assert knobs.get("param_dtype").observe(step.model, step.forward, backend) == "bfloat16"
    assert candidate.compute_dtype(backend) == "bfloat16"


def test_bf16_parameters_are_judged_by_the_guardrail_like_any_setting() -> None:
    backend, workload = CpuBackend(), _workload()
    reference = capture(prepare_step(workload, backend, REFERENCE), workload, backend, REFERENCE)
    candidate = Candidate(param_dtype="bfloat16")
    trial = capture(prepare_step(workload, backend, candidate), workload, backend, candidate)
    errors = relative_error(trial, reference)
    assert errors and all(0 < e < 0.1 for e in errors.values())  # bf16's rounding, finite and compared


def test_bf16_parameters_serve_an_inference_step_without_an_optimizer() -> None:
    """Issue 69, item 2: a forward-only step takes bf16 weights (how a model is served); it builds
    no optimizer and no gradients, and the guardrail judges its output."""
    backend = CpuBackend()
    workload = dataclasses.replace(_workload(), loss_fn=None, make_batch=lambda b, s: torch.randn(b, 6))
    candidate = Candidate(param_dtype="bfloat16")
    step = prepare_step(workload, backend, candidate)
    assert step.optimizer is None and {p.dtype for p in step.model.parameters()} == {torch.bfloat16}
    out = step.run()
    assert out.dtype == torch.float32 and not out.requires_grad
    assert all(p.grad is None for p in step.model.parameters())
    reference = capture(prepare_step(workload, backend, REFERENCE), workload, backend, REFERENCE)
    errors = relative_error(capture(step, workload, backend, candidate), reference)
    assert set(errors) == {"output"} and 0 < errors["output"] < 0.1


class Rotary(nn.Module):
    """Positions turned by frequencies derived from the config (a non-persistent buffer, as a
    Llama's RoPE `inv_freq`), and a running statistic (a persistent buffer, as a norm's)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(64, 64)
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, 64, 2).float() / 64), persistent=False)
        self.register_buffer("running", torch.ones(64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        angles = torch.arange(x.shape[-2], dtype=torch.float32, device=x.device)[:, None] * self.inv_freq.float()
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        h = self.proj(x)
        even, odd = h[..., ::2], h[..., 1::2]
        return torch.cat([even * cos - odd * sin, even * sin + odd * cos], -1) * self.running


def test_bf16_parameters_keep_the_models_derived_constants_in_their_dtype() -> None:
    """The chip's `hf:llama` run: `model.to(bf16)` rounded RoPE's frequencies, turning positions
    up to 2048 into other angles, and bf16 parameters failed the guardrail at 0.30 against fp32.
    Parameters and persistent buffers follow the knob; non-persistent ones keep their dtype."""
    from tpu_tuner.knobs.param_dtype import cast_parameters

    torch.manual_seed(0)
    model, x = Rotary(), torch.randn(1, 2048, 64)
    reference = model(x)
    cast = cast_parameters(Rotary().requires_grad_(False), torch.bfloat16)
    cast.load_state_dict(model.state_dict())
    assert cast.proj.weight.dtype == cast.running.dtype == torch.bfloat16 and cast.inv_freq.dtype == torch.float32
    assert "inv_freq" in dict(cast.named_buffers())  # still a buffer, so `.to(device)` moves it
    error = ((cast(x) - reference).norm() / reference.norm()).item()
    rounded = Rotary()
    rounded.load_state_dict(model.state_dict())
    rounded.to(torch.bfloat16)  # every buffer cast, as before
    rounded_error = ((rounded(x.bfloat16()).float() - reference).norm() / reference.norm()).item()
    assert error < 0.02 < 0.1 < rounded_error, (error, rounded_error)  # 0.004 and 0.139 here


def test_param_dtype_applies_to_every_step_and_refuses_bad_values() -> None:
    knob = knobs.get("param_dtype")
    assert not isinstance(knob, NarrowedByWorkload)  # training and inference alike
    with pytest.raises(ValueError, match=r"^param_dtype must be one of default, bfloat16, not 'float16'"):
        knob.check("float16")
    assert knob.observe(Mlp(), Mlp(), CpuBackend()) == "default"
    assert "cast_parameters(model, torch.bfloat16)" in "\n".join(knob.code("bfloat16", "cuda"))


def test_bf16_parameters_are_estimated_before_they_run() -> None:
    """Issue 69, item 3: the setting the TPU space seeds first had no memory estimate: fake tensors
    refuse `model.to`'s swap ("Couldn't swap Embedding.weight"). Cast in place, it has one, below fp32's."""
    from tpu_tuner.execution.memory_estimate import estimate_step_memory

    backend, workload = CpuBackend(), _workload()
    fp32 = estimate_step_memory(workload, backend, Candidate(), 64)
    bf16 = estimate_step_memory(workload, backend, Candidate(param_dtype="bfloat16"), 64)
    assert bf16.reason is None and bf16.step_bytes is not None and fp32.step_bytes is not None
    assert bf16.step_bytes < fp32.step_bytes
