"""The `micro_batches` knob: gradient accumulation over k micro-batches of the declared batch.

The training step splits its batch into k equal slices along the first dimension, runs forward
and backward on each with the loss scaled by 1/k, and takes one optimizer step: for a
mean-reduced loss the accumulated gradient is the full batch's gradient (the same effective
batch, so the numerics contract holds; the accuracy guardrail compares the accumulated gradients
against the full-batch fp32 reference, which also catches a sum-reduced loss, where 1/k is wrong).
Its purpose is memory: only one slice's activations are alive at a time, at the cost of k smaller,
less efficient forward/backward passes. A batch that k does not divide is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpu_tuner.knobs.base import Knob
from tpu_tuner.knobs.capabilities import CANNOT_RUN, NarrowedByWorkload, TrainingStep

if TYPE_CHECKING:
    from tpu_tuner.knobs.traits import WorkloadTraits


class MicroBatchesKnob(Knob, NarrowedByWorkload, TrainingStep):
    name = "micro_batches"
    agent = "memory"
    default = "1"
    position = 65
    values = ("1", "2", "4", "8")
    described = "{value} micro-batches"
    not_applicable = "an inference step has no backward pass to accumulate over"

    def applies_to_workload(self, traits: WorkloadTraits) -> bool:
        return traits.training  # an inference step has no backward pass to accumulate over

    def choice_refusal(self, value: str, traits: WorkloadTraits) -> str | None:
        divides = traits.batch_size is None or traits.batch_size % int(self.check(value)) == 0
        return None if divides else CANNOT_RUN

    def micro_batches(self, value: str) -> int:
        return int(self.check(value))

    def training_code(self, value: str, device_kind: str) -> list[str]:
        k = int(self.check(value))
        if k == 1:
            return []
        return [
            f"# gradient accumulation: {k} micro-batches of the batch, one optimizer step (a mean-reduced loss)",
            "training_loss = applied.training_loss(loss_fn)  # (inputs, target) -> loss, as the trial computed it",
            f"for inputs_i, target_i in zip(inputs.chunk({k}), target.chunk({k})):",
            f"    loss = training_loss(inputs_i, target_i) / {k}",
            "    loss.backward()",
            "optimizer.step()",
            "optimizer.zero_grad(set_to_none=True)",
        ]

    def observe_training(self, optimizer: object, micro_batches: int, loss: object) -> str | None:
        return str(micro_batches)
