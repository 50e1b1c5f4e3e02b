"""`compile_scope = step`: the whole training step traced as one program (execution/traced_step.py,
TorchTPU's SingleTraceTrainer; 2.31x over the model compiled on a v5e chip, docs/torchtpu.md).

torch-tpu's trainer needs a chip, so a stand-in with its calls (run eagerly: plain SGD at the
AdamW's lr) is handed in as the CPU backend's step tracer: the wiring is checked (the user's AdamW
hyperparameters, bf16 moments only beside bf16 parameters, the loss with its target as a graph
input, the step contexts around the trace and every step, a read of what the update wrote, the
guardrail's gradients from the traced program), and so are the agent's refusals and seeds."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from tpu_tuner.core.errors import WorkloadError
from tpu_tuner.devices.cpu import CpuBackend
from tpu_tuner.execution.accuracy import capture
from tpu_tuner.execution.step import prepare_step
from tpu_tuner.execution.timer import StepClock
from tpu_tuner.knobs import registry as knobs
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.model.workloads.loader import load_workload
from tpu_tuner.model.workloads.workload import Workload
from tpu_tuner.tuning.agents import step_trace

TINY = Path(__file__).parent / "fixtures" / "tiny_gpt.py"
TRACED = {"execution": "inductor", "compile_scope": "step"}


class StandInTrainer:
    """SingleTraceTrainer's calls, run eagerly; without an optimizer it leaves the gradients in `.grad`."""

    made: list[StandInTrainer] = []

    def __init__(self, model, optimizer, compile_fn=None, compute_loss_fn=None) -> None:
        self.model, self.optimizer, self.compute_loss_fn = model, optimizer, compute_loss_fn
        self.compile_fn = compile_fn
        self.traced_under_autocast: bool | None = None
        self.params = dict(model.named_parameters())
        StandInTrainer.made.append(self)

    def make_compiled_train_step(self, example_inputs):
        self.traced_under_autocast = torch.is_autocast_enabled("cpu")

        def train_step(inputs):
            if self.compile_fn is not None:  # a graph compiled each step, as the real trainer's program runs
                self.compile_fn(lambda x: x * 2)(torch.ones(1))
            loss = self.compute_loss_fn(self.model, tuple(inputs), {})
            loss.backward()
            if self.optimizer is not None:
                with torch.no_grad():
                    for p in self.params.values():
                        p -= self.optimizer.lr * p.grad
                        p.grad = None
            return loss.detach()

        return train_step


class StandInAdamW:
    def __init__(self, **hyperparameters) -> None:
        self.__dict__.update(hyperparameters)


@pytest.fixture
def tracer(monkeypatch):
    """The CPU backend with the stand-in as its whole-step tracer, compiling with aot_eager (the
    stand-in's graph is a toy: inductor's first compile in a process would cost the test 10 s)."""
    optimizers = types.SimpleNamespace(AdamW=StandInAdamW, SingleTraceTrainer=StandInTrainer)
    monkeypatch.setattr(CpuBackend, "step_tracer", lambda self: optimizers)
    monkeypatch.setattr(CpuBackend, "default_compile_backend", lambda self: "aot_eager")
    StandInTrainer.made.clear()
    return optimizers


def _step(over: dict[str, str]):
    workload, backend = load_workload(str(TINY)), CpuBackend()
    return prepare_step(workload, backend, Candidate({**TRACED, **over}), 2, 16), workload, backend


def test_the_traced_step_trains_with_the_users_hyperparameters_and_reads_its_update(tracer) -> None:
    step, _, backend = _step({"autocast": "bfloat16"})
    (trainer,) = StandInTrainer.made
    assert trainer.optimizer.lr == 1e-4 and (trainer.optimizer.beta1, trainer.optimizer.beta2) == (0.9, 0.999)
    assert trainer.optimizer.weight_decay == 0.01  # torch's AdamW default, handed on
    assert trainer.optimizer.use_bfloat16_moments is False  # fp32 parameters: moments of their dtype
    assert trainer.traced_under_autocast  # the setting's step contexts around the trace
    before = {name: p.detach().clone() for name, p in trainer.params.items()}
    assert StepClock.of(step, backend).seconds(2) > 0  # two steps, ended by the read
    assert any(not torch.equal(before[name], p) for name, p in trainer.params.items())


def test_bf16_parameters_get_bf16_moments(tracer) -> None:
    _step({"param_dtype": "bfloat16"})
    assert StandInTrainer.made[0].optimizer.use_bfloat16_moments is True


def test_the_guardrail_compares_the_traced_programs_own_gradients(tracer) -> None:
    step, workload, backend = _step({})
    traced = capture(step, workload, backend, Candidate(TRACED))
    assert StandInTrainer.made[-1].optimizer is None  # forward and backward only: no weight touched
    eager_step = prepare_step(workload, backend, Candidate(), 2, 16)
    eager = capture(eager_step, workload, backend, Candidate())
    assert torch.allclose(traced.parts["loss"], eager.parts["loss"])
    assert torch.allclose(traced.parts["gradients"], eager.parts["gradients"], atol=1e-6)


def test_what_the_step_cannot_take_is_refused_by_name(tracer, monkeypatch) -> None:
    monkeypatch.setattr(Workload, "optimizer_for", lambda self, model: torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(WorkloadError, match="takes an AdamW optimizer .*not SGD"):
        _step({})


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda params: torch.optim.AdamW(params, lr=1e-3, amsgrad=True), "has no amsgrad"),
        (
            lambda params: torch.optim.AdamW(
                [{"params": params[:1], "weight_decay": 0.0}, {"params": params[1:]}], lr=1e-3
            ),
            "groups differ in weight_decay",
        ),
    ],
)
def test_adamw_settings_the_devices_adamw_cannot_take_are_refused(tracer, monkeypatch, make, message) -> None:
    monkeypatch.setattr(Workload, "optimizer_for", lambda self, model: make(list(model.parameters())))
    with pytest.raises(WorkloadError, match=message):
        _step({})


def test_a_device_without_a_tracer_refuses_it() -> None:
    with pytest.raises(WorkloadError, match="needs a device that traces a whole step .*cpu has none"):
        _step({})


def test_the_agent_refuses_what_torch_func_cannot_trace_and_seeds_it_under_compiling_executions() -> None:
    def refusal(**over: str) -> str | None:
        return step_trace.validate(Candidate({**TRACED, **over}))

    assert refusal() is None
    assert "saved-tensor hooks" in (refusal(activation_checkpointing="blocks") or "")
    assert "setup_context" in (refusal(attention_kernel="splash:1024") or "")
    assert "takes one batch" in (refusal(micro_batches="2") or "")
    assert "its own AdamW" in (refusal(optimizer_impl="fused") or "")
    assert step_trace.validate(Candidate(compile_scope="step", activation_checkpointing="blocks")) is None  # eager
    choices = {"compile_scope": ("model", "step")}
    assert step_trace.seeds(choices, [{"execution": "eager"}, {"execution": "inductor"}]) == [
        {"execution": "inductor", "compile_scope": "step"}
    ]
    assert step_trace.seeds({"compile_scope": ("model",)}, [{"execution": "inductor"}]) == []


def test_the_knob_offers_it_to_training_steps_and_writes_the_loop() -> None:
    from tpu_tuner.knobs.traits import WorkloadTraits

    knob = knobs.get("compile_scope")
    inference = WorkloadTraits(training=False, conv_weights=0, repeated_blocks=4, batch_size=2)
    assert "no backward or optimizer step" in (knob.choice_refusal("step", inference) or "")
    code = "\n".join(Candidate(execution="tpu", compile_scope="step").training_code("tpu"))
    assert "torch.tpu.optimizers.SingleTraceTrainer(model, adamw" in code and "make_compiled_train_step" in code
    compile(code, "<training code>", "exec")  # the user's loop lines parse


def test_the_memory_estimate_builds_the_step_untraced(tracer) -> None:
    """The estimate runs the eager step on fake tensors: no trainer traces them."""
    from tpu_tuner.execution.memory_estimate import estimate_step_memory

    estimate = estimate_step_memory(load_workload(str(TINY)), CpuBackend(), Candidate(TRACED), 2, 16)
    assert estimate.step_bytes and not StandInTrainer.made


def test_a_trial_of_the_traced_step_is_measured_and_judged_in_a_worker(tracer, monkeypatch, fast_settings) -> None:
    """The trial path (runner/jobs.py's run_measure, in process): built traced, timed to what the
    update wrote, its guardrail errors from the traced program's gradients against fp32 eager."""
    from tpu_tuner.runner.jobs import WorkerState, run_measure
    from tpu_tuner.runner.requests import MeasureRequest

    state = WorkerState(str(TINY), "cpu")
    request = MeasureRequest(
        candidate={"execution": "aot_eager", "compile_scope": "step"},
        batch_size=2,
        seq_len=16,
        settings=fast_settings,
        model_flops_per_step=1e6,
        peak_flops_per_s={"float32": 1e12, "bfloat16": 1e12},
    )
    measured = run_measure(state, request)
    assert measured.step_median > 0 and measured.compiles.get("torch_compile_graphs", 0) >= 1
    assert any(t.optimizer is None for t in StandInTrainer.made)  # the guardrail's trainer
    assert measured.accuracy_errors and max(measured.accuracy_errors.values()) < 1e-5
