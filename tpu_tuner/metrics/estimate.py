"""Estimate a step's FLOPs, memory and time before running it, from a meta-device pass.

The model and its inputs are built on PyTorch's ``meta`` device (shapes and dtypes, no storage),
and one step runs there under the FLOP counter, the traffic counter and a live-memory tracker.
Nothing is allocated and no arithmetic runs, so a step that would need tens of GB or minutes is
sized in seconds, and refused before it starts (see `check_budget`).

Memory = parameters + optimizer state + inputs + the peak of the tensors the step keeps alive at
once (activations, saved tensors for backward, gradients). Time = FLOPs at the device's peak plus
unfused bytes at its memory bandwidth: an optimistic figure (real kernels run below the
roofline), so a refusal is never a false alarm about speed. Where the meta pass fails (an
operator without a meta kernel, user code that insists on real data) there is no estimate and
the profile goes on without one.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.units import binary_bytes, si
from tpu_tuner.metrics.flops import TrafficCounter, flop_counter
from tpu_tuner.model.workloads.batch import leading_size
from tpu_tuner.model.workloads.workload import Workload, call_model, move_to

log = logging.getLogger(__name__)

META = torch.device("meta")


class LiveMemory(TorchDispatchMode):
    """Tracks the bytes of tensors that ops create and that are still alive, and their peak.

    Outputs that alias an input (views, in-place ops) add nothing; a tensor's bytes are released
    when it is freed (a weakref finalizer), so saved-for-backward tensors stay counted until
    backward frees them.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0

    def _release(self, nbytes: int) -> None:
        self.live -= nbytes

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if not any(ret.alias_info is not None for ret in func._schema.returns):
            for tensor in tree_flatten(out)[0]:
                if isinstance(tensor, torch.Tensor):
                    nbytes = tensor.numel() * tensor.element_size()
                    self.live += nbytes
                    weakref.finalize(tensor, self._release, nbytes)
            self.peak = max(self.peak, self.live)
        return out


@dataclass(frozen=True)
class StepEstimate:
    """What one step needs, from the meta-device pass."""

    flops: int
    bytes_unfused: int
    parameter_bytes: int
    optimizer_bytes: int
    input_bytes: int
    peak_live_bytes: int  # activations, saved tensors and gradients alive at once, at the peak
    batch_size: int | None  # the leading size of the inputs it was estimated at

    @property
    def memory_bytes(self) -> int:
        return self.parameter_bytes + self.optimizer_bytes + self.input_bytes + self.peak_live_bytes

    def seconds(self, peak_flops_per_s: float | None, memory_bytes_per_s: float | None) -> float | None:
        """FLOPs at peak plus bytes at bandwidth: optimistic (kernels run below the roofline)."""
        if not peak_flops_per_s:
            return None
        seconds = self.flops / peak_flops_per_s
        if memory_bytes_per_s:
            seconds += self.bytes_unfused / memory_bytes_per_s
        return seconds

    def describe(self) -> str:
        return (
            f"{si(self.flops, 'FLOP')}, {binary_bytes(self.memory_bytes)} "
            f"(parameters {binary_bytes(self.parameter_bytes)}, optimizer {binary_bytes(self.optimizer_bytes)}, "
            f"inputs {binary_bytes(self.input_bytes)}, activations at peak {binary_bytes(self.peak_live_bytes)})"
        )


def _bytes(tensors: Any) -> int:
    seen: set[int] = set()
    total = 0
    for tensor in tree_flatten(tensors)[0]:
        if isinstance(tensor, torch.Tensor) and id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor.numel() * tensor.element_size()
    return total


def estimate_step(workload: Workload, batch_size: int | None, seq_len: int | None) -> StepEstimate | None:
    """Run one step of `workload` on the meta device; None (logged) where that is impossible."""
    try:
        return _estimate(workload, batch_size, seq_len)
    except Exception as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        log.info(
            "no size estimate before running (the meta-device pass failed: %s: %s)", type(exc).__name__, message[:200]
        )
        return None


def _estimate(workload: Workload, batch_size: int | None, seq_len: int | None) -> StepEstimate:
    torch.manual_seed(0)
    # Factory calls in user code (torch.randn in get_inputs, torch.zeros in __init__ or forward)
    # land on the meta device inside this block; explicit devices are moved there after.
    with META:
        model = workload.build_model().to(META)
        inputs, target = workload.split_batch(workload.batch(batch_size, seq_len))
        inputs, target = move_to(inputs, META), move_to(target, META)
        model.train(workload.is_training)
        parameters = list(model.parameters())
        parameter_bytes = _bytes(parameters) + _bytes(list(model.buffers()))
        flops, traffic, live = flop_counter(), TrafficCounter(), LiveMemory()
        with flops, traffic, live:
            if workload.is_training:
                assert workload.loss_fn is not None
                workload.loss_fn(call_model(model, inputs), target).backward()
            else:
                with torch.no_grad():
                    call_model(model, inputs)
    trainable = sum(p.numel() * p.element_size() for p in parameters if p.requires_grad)
    # Adam-family optimizers (the default AdamW) keep two moments per trainable parameter; the
    # meta device cannot run an optimizer step (it reads its step counter), so this is assumed.
    optimizer_bytes = 2 * trainable if workload.is_training else 0
    return StepEstimate(
        flops=int(flops.get_total_flops()),
        bytes_unfused=traffic.bytes,
        parameter_bytes=parameter_bytes,
        optimizer_bytes=optimizer_bytes,
        input_bytes=_bytes((inputs, target)),
        peak_live_bytes=live.peak,
        batch_size=leading_size(inputs),
    )


def check_budget(
    estimate: StepEstimate,
    available_bytes: int | None,
    step_seconds: float | None,
    max_step_seconds: float,
    source: Any,
    resizable: bool,
) -> None:
    """Refuse (UserInputError, one line) a step that does not fit in memory or in the time budget."""
    hint = "pass --batch-size to shrink it" if resizable else "shrink the inputs the file makes"
    if available_bytes is not None and estimate.memory_bytes > available_bytes:
        raise UserInputError(
            f"one step needs ~{binary_bytes(estimate.memory_bytes)} ({si(estimate.flops, 'FLOP')}, "
            f"estimated on the meta device), {binary_bytes(available_bytes)} available; {hint}",
            source,
        )
    if step_seconds is not None and step_seconds > max_step_seconds:
        raise UserInputError(
            f"one step needs at least ~{step_seconds:.0f} s ({si(estimate.flops, 'FLOP')}, "
            f"{binary_bytes(estimate.memory_bytes)}, estimated at the device's peak), over the "
            f"{max_step_seconds:.0f} s budget ([budget] max_step_seconds); {hint}",
            source,
        )
