"""The `compile_scope` knob: what a training step compiles, the model alone or the model and its
loss as one graph (torchtitan's ``compile.components = ["model", "loss"]``).

``model`` (the default) compiles the forward and computes the loss on its output, outside the
compiled graph: the output head's logits are written out whole, and the loss (a log-softmax over
the vocabulary, its backward) runs as eager kernels. ``model+loss`` compiles
``loss_fn(model(inputs), target)`` as one module (`model.workloads.workload.ModelWithLoss`), with the
execution knob's backend and inductor's options, so the compiler fuses the loss with the head.
Measured on examples/gpt.py (vocabulary 8192): docs/knobs.md, "compile_scope".

Searched only where the forward compiles (under eager there is nothing to compile the loss into)
and only for training steps (an inference step has no loss).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tpu_tuner.knobs.base import Knob
from tpu_tuner.knobs.capabilities import Conditional, LeavesMemory, NarrowedByWorkload, TrainingStep

if TYPE_CHECKING:
    from tpu_tuner.knobs.traits import WorkloadTraits

MODEL = "model"
MODEL_AND_LOSS = "model+loss"


class CompileScopeKnob(Knob, Conditional, NarrowedByWorkload, TrainingStep, LeavesMemory):  # estimated eager
    """``model`` or ``model+loss``: the loss compiled with the model, as one graph."""

    name = "compile_scope"
    agent = "compile"
    default = MODEL
    position = 17  # after execution (10), which it is conditional on, and inductor's options (15)
    values = (MODEL, MODEL_AND_LOSS)
    not_applicable = "an inference step has no loss to compile with the model"

    def applies_to_workload(self, traits: WorkloadTraits) -> bool:
        return traits.training

    def active(self, settings: Mapping[str, str]) -> bool:
        """Searched only where the forward compiles."""
        from tpu_tuner.knobs.execution import ExecutionKnob, compile_options

        return compile_options(settings.get(ExecutionKnob.name, ExecutionKnob.default)) is not None

    def compiles_loss(self, value: str) -> bool:
        return self.check(value) == MODEL_AND_LOSS

    def describe(self, value: str) -> str:
        return "loss compiled with the model" if value == MODEL_AND_LOSS else ""

    def training_code(self, value: str, device_kind: str) -> list[str]:
        if value != MODEL_AND_LOSS:
            return []
        return [
            "# the loss compiled with the model as one graph, as the trial built it: "
            "call training_loss(inputs, target) where your loop calls loss_fn(model(inputs), target)",
            "training_loss = applied.training_loss(loss_fn)",
        ]

    def observe_training(self, optimizer: Any, micro_batches: int, loss: Any) -> str | None:
        import torch

        from tpu_tuner.model.workloads.workload import ModelWithLoss

        compiled = isinstance(loss, torch._dynamo.eval_frame.OptimizedModule)
        return MODEL_AND_LOSS if compiled and isinstance(loss._orig_mod, ModelWithLoss) else MODEL
