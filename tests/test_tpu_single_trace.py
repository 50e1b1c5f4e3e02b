"""benchmarks/chip/tpu_single_trace.py: the whole training step as one traced program of TorchTPU's
SingleTraceTrainer (a lever for the chip: torch-tpu's own AdamW refuses CPU tensors). Here a
stand-in trainer takes the same calls, so the wiring is checked: the user's AdamW hyperparameters,
the loss the workload defines with its target as a graph input, the step contexts around the
trace and every step, and a read of the parameters the update wrote."""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import pytest
import torch
from helpers.common import benchmark_script

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks" / "chip"
TINY = Path(__file__).parent / "fixtures" / "tiny_gpt.py"


class StandInTrainer:
    """SingleTraceTrainer's calls, run eagerly: plain SGD at the AdamW's lr, recording its inputs."""

    made: list[StandInTrainer] = []

    def __init__(self, model, optimizer, compile_fn=None, compute_loss_fn=None) -> None:
        self.model, self.optimizer, self.compute_loss_fn = model, optimizer, compute_loss_fn
        self.traced_under_autocast: bool | None = None
        self.params = dict(model.named_parameters())
        StandInTrainer.made.append(self)

    def make_compiled_train_step(self, example_inputs):
        self.traced_under_autocast = torch.is_autocast_enabled("cpu")

        def train_step(inputs):
            loss = self.compute_loss_fn(self.model, tuple(inputs), {})
            loss.backward()
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
def levers(monkeypatch):
    sys.path.insert(0, str(BENCHMARKS))
    optimizers = types.SimpleNamespace(AdamW=StandInAdamW, SingleTraceTrainer=StandInTrainer)
    monkeypatch.setattr(torch, "tpu", types.SimpleNamespace(optimizers=optimizers), raising=False)
    StandInTrainer.made.clear()
    try:
        yield benchmark_script(BENCHMARKS / "tpu_levers.py", "tpu_levers_single_trace_under_test")
    finally:
        sys.path.remove(str(BENCHMARKS))


def _build(levers, over: dict[str, str]):
    from tpu_tuner.devices import get_backend
    from tpu_tuner.model.workloads.loader import load_workload

    backend = get_backend("cpu")
    workload = load_workload(str(TINY))
    base = levers.reference_base(backend, {"execution": "eager", **over})
    args = argparse.Namespace(batch_size=2, seq=16)
    clock, _ = levers.build("whole step traced", args, workload, backend, base)
    return clock, workload


def test_the_traced_step_trains_with_the_users_hyperparameters_and_reads_its_update(levers) -> None:
    clock, workload = _build(levers, {"autocast": "bfloat16"})
    (trainer,) = StandInTrainer.made
    assert trainer.optimizer.lr == 1e-4 and (trainer.optimizer.beta1, trainer.optimizer.beta2) == (0.9, 0.999)
    assert trainer.optimizer.weight_decay == 0.01  # torch's AdamW default, handed on
    assert trainer.traced_under_autocast  # the setting's step contexts around the trace
    before = {name: p.detach().clone() for name, p in trainer.params.items()}
    assert clock.seconds(2) > 0  # two steps, ended by the read
    assert any(not torch.equal(before[name], p) for name, p in trainer.params.items())


def test_an_optimizer_other_than_adamw_is_refused_by_name(levers, monkeypatch) -> None:
    from tpu_tuner.model.workloads.workload import Workload

    monkeypatch.setattr(Workload, "optimizer_for", lambda self, model: torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="takes AdamW .*not SGD"):
        _build(levers, {"autocast": "none"})
