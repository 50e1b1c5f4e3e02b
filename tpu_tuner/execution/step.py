"""Build the callable that runs one step of a workload under a candidate on a backend."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tpu_tuner.core.errors import WorkloadError
from tpu_tuner.devices.base import Backend
from tpu_tuner.execution.host_read import float_tensors, local_tensor, read_total
from tpu_tuner.execution.weight_cache import WeightCache
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.model.workloads.batch import batch_size_of, batch_slice
from tpu_tuner.model.workloads.workload import Workload, call_model, loss_of, move_to


@dataclass
class PreparedStep:
    """One workload step, ready to run: `run()` does a step and returns its output.

    `run_eager` is the same step without torch.compile, for counting FLOPs and estimating memory:
    the dispatch-level counters only see ops that eager code dispatches. Regions compiled inside
    the model itself (its blocks, `compile_scope = blocks`, or the user's own) run eagerly there
    too. `loss` is a training step's ``(inputs, target) -> loss`` as the candidate computes it
    (None for inference).
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    batch: Any
    run: Callable[[], Any]
    run_eager: Callable[[], Any]
    forward: Callable[..., Any]  # the model as the candidate runs it (compiled or not)
    # Brings to the host a value that depends on a step's whole work, given `run`'s output
    # (`result_read`): what ends a timed block of steps (execution/timer.py).
    read: Callable[[Any], float]
    loss: Callable[[Any, Any], Any] | None = None


def prepare_step(
    workload: Workload,
    backend: Backend,
    candidate: Candidate,
    batch_size: int | None = None,
    seq_len: int | None = None,
    seed: int = 0,
    weights: WeightCache | None = None,
    trace: bool = True,
) -> PreparedStep:
    """Build the model and a batch (seeded, so reruns see the same weights and data); with
    `weights`, a worker's kept weights of an earlier build stand in for the init. `trace` False
    leaves a step the candidate traces whole (`compile_scope = step`) untraced: for a caller that
    runs only `run_eager` (the memory estimate, on fake tensors)."""
    torch.manual_seed(seed)
    try:
        model = weights.build(workload.build_model, seed) if weights is not None else workload.build_model()
    except Exception as exc:
        raise WorkloadError(f"building the model failed: {type(exc).__name__}: {exc}", workload.source) from exc
    if not isinstance(model, nn.Module):
        raise WorkloadError(f"the model factory returned {type(model).__name__}, not an nn.Module", workload.source)
    try:
        batch = workload.batch(batch_size, seq_len)
        inputs, target = workload.split_batch(batch)
    except Exception as exc:
        raise WorkloadError(f"making a batch failed: {type(exc).__name__}: {exc}", workload.source) from exc
    # Every rank of a sharded step makes the same seeded global batch and runs its slice.
    inputs, target = candidate.local_batch(inputs, target, backend)

    device = backend.device
    if any(t.device != device for t in (*model.parameters(), *model.buffers())):
        # Only where it moves something: fake tensors (execution/memory_estimate.py) cannot be swapped in place.
        model = model.to(device)
    model.train(workload.is_training)
    inputs, target = move_to(inputs, device), move_to(target, device)
    # The candidate's model-level knobs (memory format) before the optimizer sees the parameters,
    # then its forward wrapper (torch.compile): the hooks `tpu_tuner.apply` calls too. The layout
    # hears which step it splits (an inference step's data axis needs no DDP).
    model = candidate.prepare_model(model, backend, training=workload.is_training)
    # The training step's optimizer as the candidate builds it (implementation flag).
    optimizer = candidate.prepare_optimizer(workload.optimizer_for(model), backend)
    compiled = candidate.wrap_forward(model, backend)
    loss = eager_loss = None
    if workload.loss_fn is not None:
        loss = candidate.training_loss(model, workload.loss_fn, compiled, backend)
        eager_loss = loss_of(model, workload.loss_fn)

    prepared = PreparedStep(
        model=model,
        optimizer=optimizer,
        batch=(inputs, target),
        run=step_function(workload, backend, candidate, compiled, loss, optimizer, inputs, target),
        run_eager=eagerly(step_function(workload, backend, candidate, model, eager_loss, optimizer, inputs, target)),
        forward=compiled,
        loss=loss,
        read=result_read(model, workload.is_training),
    )
    if trace and workload.is_training and candidate.traces_step(backend.kind):
        from tpu_tuner.execution.traced_step import trace_whole_step  # it builds on this module

        trace_whole_step(prepared, workload, backend, candidate)
    return prepared


def eagerly(step: Callable[[], Any]) -> Callable[[], Any]:
    """`step` with every compiled region it reaches run eagerly (``torch.compiler.set_stance``)."""

    def run() -> Any:
        with torch.compiler.set_stance("force_eager"):
            return step()

    return run


def result_read(model: nn.Module, training: bool) -> Callable[[Any], float]:
    """The host read that ends a timed block (execution/timer.py): a float computed from every
    element of what the step's whole work produced. A training step's work ends in the optimizer's
    update, so the read covers every trainable parameter (the loss is known before the backward
    and the update run); an inference step's ends in its output. A full reduction, not one
    element: a compiler may compute a slice of an elementwise result without the rest. A sharded
    parameter is read in its local shard (no collective)."""
    if not training:
        return lambda output: read_total(float_tensors(output))
    params = list({id(p): local_tensor(p) for p in model.parameters() if p.requires_grad}.values())
    return lambda output: read_total(params)


def step_function(
    workload: Workload,
    backend: Backend,
    candidate: Candidate,
    forward: Callable[..., Any],
    loss: Callable[[Any, Any], Any] | None,
    optimizer: torch.optim.Optimizer | None,
    inputs: Any,
    target: Any,
) -> Callable[[], Any]:
    """One step on fixed inputs: `loss` (forward and loss, `Candidate.training_loss`) + backward
    + optimizer step for training, a no-grad `forward` for inference, under the candidate's
    autocast."""
    if workload.is_training:
        assert optimizer is not None and loss is not None
        slices = micro_batches(inputs, target, candidate.micro_batches(backend), workload)
        loss_of_slice = loss

        def train_step() -> Any:
            total = accumulate_gradients(loss_of_slice, slices, lambda: candidate.step(backend))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return total.detach()

        return train_step

    def inference_step() -> Any:
        with torch.no_grad(), candidate.step(backend):
            return call_model(forward, inputs)

    return inference_step


def micro_batches(inputs: Any, target: Any, k: int, workload: Workload) -> list[tuple[Any, Any]]:
    """The batch as `k` equal (inputs, target) slices along the first dimension; tensors whose
    first dimension is not the batch's travel whole with every slice. Refuses a batch that `k`
    does not divide: unequal slices would weight the samples unequally under a 1/k loss scale."""
    if k == 1:
        return [(inputs, target)]
    size = batch_size_of(inputs)
    if size is None or size % k:
        raise WorkloadError(
            f"micro_batches {k}: the batch of {size} samples does not split into {k} equal parts", workload.source
        )
    return [(batch_slice(inputs, size, k, i), batch_slice(target, size, k, i)) for i in range(k)]


def accumulate_gradients(
    loss_of: Callable[[Any, Any], torch.Tensor],
    slices: list[tuple[Any, Any]],
    autocast: Callable[[], contextlib.AbstractContextManager[Any]],
) -> torch.Tensor:
    """Forward and backward over each slice with its loss scaled by 1/len(slices), gradients
    accumulating in `.grad`: for a mean-reduced loss the result is the whole batch's gradient.
    Returns the whole batch's loss (the scaled losses summed), detached."""
    total: torch.Tensor | None = None
    for inputs, target in slices:
        with autocast():
            loss = loss_of(inputs, target)
        if len(slices) > 1:
            loss = loss / len(slices)
        loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
    assert total is not None
    return total


def run_user_step(step: Callable[[], Any], workload: Workload, what: str) -> Any:
    """Run a step the first time, turning an error in user code into a `WorkloadError`."""
    try:
        return step()
    except (WorkloadError, KeyboardInterrupt):
        raise
    except Exception as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise WorkloadError(f"{what} failed: {type(exc).__name__}: {message}", workload.source) from exc
