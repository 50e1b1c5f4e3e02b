"""The accuracy guardrail: a trial's outputs against a full-fp32 eager reference.

Inference compares the model outputs; training compares the loss and the gradients of the
first step (before any optimizer step; accumulated over the candidate's micro-batches), on the
same seeded weights and inputs. The error is relative: ||trial - reference|| / ||reference||,
the largest over the compared parts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tpu_tuner.devices.base import Backend
from tpu_tuner.execution.step import PreparedStep, accumulate_gradients, micro_batches
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.model.batch import batch_size_of
from tpu_tuner.model.workload import Workload, call_model

REFERENCE = Candidate()  # eager, fp32 "highest", no autocast


@dataclass
class Outputs:
    """What a step produced that the guardrail compares, on the CPU, in float32."""

    parts: dict[str, torch.Tensor]


def capture(step: PreparedStep, workload: Workload, backend: Backend, candidate: Candidate) -> Outputs:
    """Run the candidate's forward (and backward) once without touching the weights."""
    inputs, target = step.batch
    if workload.is_training:
        assert step.loss is not None
        # The candidate's own accumulation (micro-batches, loss / k): its accumulated gradients
        # are what is compared with the whole-batch fp32 reference.
        slices = micro_batches(inputs, target, candidate.micro_batches(backend), workload)
        loss = accumulate_gradients(step.loss, slices, lambda: candidate.step(backend))
        # As a rank of a sharded step: its slice's loss averaged over the ranks, and every
        # gradient whole (gathered from its shards; every rank takes part, in parameter order).
        loss = backend.mean_over_ranks(loss)
        grads = [whole(p.grad).detach().float().flatten() for p in step.model.parameters() if p.grad is not None]
        parts = {"loss": loss.detach().float().reshape(1).cpu(), "gradients": torch.cat(grads).cpu()}
        step.model.zero_grad(set_to_none=True)
    else:
        with torch.no_grad(), candidate.step(backend):
            output = call_model(step.forward, inputs)
        # As a rank of a sharded step: the global batch's output, every rank's slice gathered in
        # batch order (every rank takes part), as one device computes it on the whole batch.
        output = candidate.gather_output(output, batch_size_of(inputs), backend)
        parts = {"output": flatten_output(output).cpu()}
    return Outputs(parts)


def relative_error(trial: Outputs, reference: Outputs) -> dict[str, float]:
    """Relative L2 error of each compared part (inf where shapes differ or values are not finite)."""
    errors: dict[str, float] = {}
    for name, expected in reference.parts.items():
        got = trial.parts.get(name)
        if got is None or got.shape != expected.shape or not torch.isfinite(got).all():
            errors[name] = float("inf")
            continue
        scale = expected.norm().item() or 1.0
        errors[name] = (got - expected).norm().item() / scale
    return errors


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor (a sharded gradient) gathered whole; any other tensor as it is."""
    if type(tensor).__name__ == "DTensor":  # no torch.distributed import for single-process steps
        return tensor.full_tensor()  # type: ignore[attr-defined]  # a DTensor, found by name above
    return tensor


def flatten_output(output: Any) -> torch.Tensor:
    """A model's output (a tensor, a dict by key, a tuple or list of them) as one flat float32
    tensor: what the guardrail compares."""
    if isinstance(output, torch.Tensor):
        return whole(output).detach().float().flatten()
    if isinstance(output, dict):
        return torch.cat([flatten_output(v) for _, v in sorted(output.items())])
    if isinstance(output, (tuple, list)):
        return torch.cat([flatten_output(v) for v in output])
    raise TypeError(f"cannot compare a model output of type {type(output).__name__}")
