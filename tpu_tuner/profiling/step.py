"""Build the callable that runs one step of a workload under a candidate on a backend."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tpu_tuner.backends.base import Backend
from tpu_tuner.candidate import Candidate
from tpu_tuner.errors import WorkloadError
from tpu_tuner.workload import Workload, call_model, move_to


@dataclass
class PreparedStep:
    """One workload step, ready to run: `run()` does a step and returns its output.

    `run_eager` is the same step without torch.compile, for counting FLOPs: the dispatch-level
    counters only see ops that eager code dispatches.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    batch: Any
    run: Callable[[], Any]
    run_eager: Callable[[], Any]
    forward: Callable[..., Any]  # the model as the candidate runs it (compiled or not)


def prepare_step(
    workload: Workload,
    backend: Backend,
    candidate: Candidate,
    batch_size: int | None = None,
    seq_len: int | None = None,
    seed: int = 0,
) -> PreparedStep:
    """Build the model and a batch (seeded, so reruns see the same weights and data)."""
    torch.manual_seed(seed)
    try:
        model = workload.build_model()
    except Exception as exc:  # noqa: BLE001 - user code
        raise WorkloadError(f"building the model failed: {type(exc).__name__}: {exc}", workload.source) from exc
    if not isinstance(model, nn.Module):
        raise WorkloadError(f"the model factory returned {type(model).__name__}, not an nn.Module", workload.source)
    try:
        batch = workload.batch(batch_size, seq_len)
        inputs, target = workload.split_batch(batch)
    except Exception as exc:  # noqa: BLE001 - user code
        raise WorkloadError(f"making a batch failed: {type(exc).__name__}: {exc}", workload.source) from exc

    device = backend.device
    model = model.to(device)
    model.train(workload.is_training)
    inputs, target = move_to(inputs, device), move_to(target, device)
    # The candidate's model-level knobs (memory format) before the optimizer sees the parameters,
    # then its forward wrapper (torch.compile): the hooks `tpu_tuner.apply` calls too.
    model = backend.prepare_model(model, candidate)
    optimizer = workload.optimizer_for(model)
    compiled = backend.compile(model, candidate)

    return PreparedStep(
        model=model,
        optimizer=optimizer,
        batch=(inputs, target),
        run=step_function(workload, backend, candidate, compiled, optimizer, inputs, target),
        run_eager=step_function(workload, backend, candidate, model, optimizer, inputs, target),
        forward=compiled,
    )


def step_function(workload: Workload, backend: Backend, candidate: Candidate, forward: Callable[..., Any],
                  optimizer: torch.optim.Optimizer | None, inputs: Any, target: Any) -> Callable[[], Any]:
    """One step of `forward` on fixed inputs: forward + loss + backward + optimizer step for
    training, a no-grad forward for inference, under the candidate's autocast."""
    if workload.is_training:
        assert optimizer is not None and workload.loss_fn is not None
        loss_fn = workload.loss_fn

        def train_step() -> Any:
            with backend.autocast(candidate):
                loss = loss_fn(call_model(forward, inputs), target)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss.detach()

        return train_step

    def inference_step() -> Any:
        with torch.no_grad(), backend.autocast(candidate):
            return call_model(forward, inputs)

    return inference_step


def run_user_step(step: Callable[[], Any], workload: Workload, what: str) -> Any:
    """Run a step the first time, turning an error in user code into a `WorkloadError`."""
    try:
        return step()
    except (WorkloadError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - user code may raise anything
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise WorkloadError(
            f"{what} failed: {type(exc).__name__}: {message}", workload.source
        ) from exc
