"""A training or inference step's peak memory, estimated on fake tensors before anything runs.

The one module that uses torch's private memory tracker, ``torch.distributed._tools``
(``mem_tracker.MemTracker``; ``fsdp2_mem_tracker.FSDPMemTracker`` where FSDP2 shards the model),
written against torch 2.13 (https://github.com/pytorch/pytorch/blob/v2.13.0/torch/distributed/_tools/mem_tracker.py).
The step is built under ``FakeTensorMode`` as the trial builds it (the candidate's model knobs,
layout, optimizer, autocast, activation checkpointing, micro-batches) and run eagerly twice: the
second step holds the optimizer's state, as every measured step does. The tracker sees each
storage the dispatcher allocates and frees, so its peak is the step's peak of tensor memory;
nothing is computed, so a GPT step estimates in seconds whatever its size.

On a CPU the tensors' peak is not the resident set's: the storage changes are replayed through
the process's own malloc (`malloc_replay.py`, its fragmentation included; glibc's heap model,
`heap_model.py`, where that cannot run and as the floor) for what malloc keeps beyond it. What it
cannot see (docs/tuning.md, "Memory before measurement"): inductor's compiled graphs (the eager
step stands for them; compiled code frees and fuses more, so the estimate is high there; a
cross-entropy compiled with the model is estimated as fused: `fused_loss.py`), memory a
kernel or a collective allocates outside the dispatcher (oneDNN scratchpads; inside gloo, beyond
the tensors and the least of its workers' arenas that `gloo_buffers.py` models), the small
objects the real step places between its tensors, and the process itself. A model that does not run on fake tensors
(a data-dependent branch, ``.item()``) gets no estimate: the reason is returned, and the trial
runs as it would without one.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
import traceback
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from typing import Any, cast

from tpu_tuner.core.errors import first_line
from tpu_tuner.devices.base import Backend
from tpu_tuner.execution.heap_model import Change, replay
from tpu_tuner.execution.malloc_replay import heap_growth
from tpu_tuner.knobs import capabilities as kinds
from tpu_tuner.knobs import registry
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.execution import ExecutionKnob, compile_options
from tpu_tuner.model.workloads.workload import Workload

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemoryEstimate:
    """A step's estimated peak, or why there is none.

    `step_bytes`: the peak of the step's tensors (parameters, gradients, optimizer state, batch,
    activations) on this process's device; `in_use_bytes`: what the process already held when the
    estimate was made, as the backend measures memory (`Backend.memory_in_use_bytes`);
    `retained_bytes`: what a heap that keeps freed memory holds beyond that peak (glibc on a CPU,
    `heap_model.py`); `arena_bytes`: what other threads' arenas will keep (gloo's workers under a
    layout, `gloo_buffers.py`); `peak_bytes` is their sum, in the terms of the measured peak it is
    compared with."""

    step_bytes: int | None
    in_use_bytes: int = 0
    reason: str | None = None  # why there is no estimate
    seconds: float = 0.0
    # The part of the step's peak a compiler cannot shrink: parameters, buffers, gradients,
    # optimizer state and the batch (the peak less activations and temporaries).
    floor_bytes: int | None = None
    retained_bytes: int = 0
    # The step's storage changes in order: what the heap keeps is read again from them with the
    # process's free heap at each use (a rank estimates before its reference step freed any).
    changes: tuple[Change, ...] = field(default=(), repr=False, compare=False)
    arena_bytes: int = 0

    @property
    def peak_bytes(self) -> int | None:
        if self.step_bytes is None:
            return None
        return self.step_bytes + self.retained_bytes + self.arena_bytes + self.in_use_bytes


class WouldNotFit(RuntimeError):
    """A step refused before it ran: its estimated peak is over the memory limit (its message
    starts "would not fit:", which `core.failures.classify` reads as WOULD_NOT_FIT)."""


def tracker_classes() -> tuple[Any, Any] | str:
    """torch's (MemTracker, FSDPMemTracker), or why they are missing (a torch without them)."""
    try:
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError as exc:  # private API: moved or gone in another torch
        return f"torch's memory tracker is missing (torch.distributed._tools, written for torch 2.13): {exc}"
    return MemTracker, FSDPMemTracker


def estimate_step_memory(
    workload: Workload,
    backend: Backend,
    candidate: Candidate,
    batch_size: int | None = None,
    seq_len: int | None = None,
) -> MemoryEstimate:
    """The peak memory of `candidate`'s step on this process (its rank's shard under a layout),
    estimated on fake tensors; never raises for the model's sake (the reason is returned)."""
    started = time.perf_counter()
    classes = tracker_classes()
    if isinstance(classes, str):
        return MemoryEstimate(None, reason=classes)
    try:
        step_bytes, floor, changes = _fake_step_peak(workload, backend, candidate, batch_size, seq_len, *classes)
    except Exception as exc:  # the model's code on fake tensors: any error means no estimate
        # One line of what failed for the report; the library's own message to the workers' log.
        reason = f"the step does not run on fake tensors ({type(exc).__name__} in {_raised_in(exc)})"
        log.warning("no memory estimate for %s: %s", candidate.describe() or "the baseline", first_line(exc))
        return as_of_now(MemoryEstimate(None, reason=reason, seconds=time.perf_counter() - started), backend)
    finally:
        gc.collect()
    made = MemoryEstimate(step_bytes, 0, None, time.perf_counter() - started, floor, changes=tuple(changes))
    return as_of_now(made, backend)


def _raised_in(exc: BaseException) -> str:
    """Where `exc` was raised, as a path a user can place: inside an installed package from the
    package's folder on ("torch/distributed/_tools/mem_tracker.py"), else the file's name."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "an unknown place"
    path = frames[-1].filename.replace("\\", "/")
    inside = path.rsplit("-packages/", 1)
    return inside[1] if len(inside) == 2 else path.rsplit("/", 1)[-1]


def as_of_now(estimate: MemoryEstimate, backend: Backend) -> MemoryEstimate:
    """`estimate` in this process's present terms: what it holds now, and what its heap would
    keep beyond the step's peak (`malloc_replay.py`, never below `heap_model.py`'s; nothing where
    the backend's allocator keeps nothing freed)."""
    free_heap = backend.free_heap_bytes()
    retained = 0
    if free_heap is not None and estimate.step_bytes is not None:
        # The process's own malloc, replayed, places the chunks as the real step will, holes and
        # all (malloc_replay.py); the model (every freed byte reused) is the floor, and stands in
        # where the replay cannot run. The growth is over the whole resident set, whose free heap
        # `in_use_bytes` leaves out: what the heap keeps beyond the step's own peak is that free
        # heap plus the growth, less the peak.
        growth = heap_growth(estimate.changes)
        model = replay(estimate.changes, free_heap)
        retained = model.retained if growth is None else max(model.retained, free_heap + growth - estimate.step_bytes)
    return replace(estimate, in_use_bytes=backend.memory_in_use_bytes() or 0, retained_bytes=retained)


def _fake_step_peak(
    workload: Workload,
    backend: Backend,
    candidate: Candidate,
    batch_size: int | None,
    seq_len: int | None,
    mem_tracker: Any,
    fsdp_mem_tracker: Any,
) -> tuple[int, int, list[Change]]:
    """The step's peak on fake tensors, the part of it no compiler removes (`floor_bytes`), and
    the device's storage changes in order (the warm step's marked timed)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tpu_tuner.execution.fused_loss import FusedCrossEntropy
    from tpu_tuner.execution.step import prepare_step

    built_on = stand_in(backend)
    # A loss compiled with the model by a fusing backend holds no vocabulary-sized temporaries.
    loss = FusedCrossEntropy() if fuses_loss(candidate, backend.kind) else contextlib.nullcontext()
    with candidate.process(backend), backend.estimate_kernels(), FakeTensorMode(allow_non_fake_inputs=True), loss:
        step = prepare_step(workload, built_on, candidate, batch_size, seq_len, trace=False)
        fsdp = _is_fsdp2(step.model)
        recording = _recording(fsdp_mem_tracker if fsdp else mem_tracker, torch.device(built_on.device).type)
        tracker = recording(step.model, step.optimizer) if fsdp else recording()
        if fsdp:
            tracker.track_inputs(step.batch)
        else:
            tracker.track_external(*(x for x in (step.model, step.optimizer) if x is not None), step.batch)
        with tracker:
            step.run_eager()  # the first step creates the optimizer's state
            tracker.reset_mod_stats()  # the tracker keeps per-module stats of one iteration only
            tracker.timed = True
            step.run_eager()
        peaks = tracker.get_tracker_snapshot("peak")
    device = torch.device(built_on.device)
    snaps = [snap for dev, snap in peaks.items() if dev.type == device.type]
    if not snaps:
        return 0, 0, []
    snap = max(snaps, key=lambda s: s[TOTAL])
    transient = sum(v for k, v in snap.items() if k in TRANSIENT)
    return int(snap[TOTAL]), int(snap[TOTAL] - transient), tracker.changes


class _StandIn:
    """A backend as the fake step sees it where fake tensors cannot live on its device: its own in
    all but the device, and the device type autocast and the knobs key on (a chip's bf16 autocast
    then casts the CPU fake tensors as it would the chip's)."""

    def __init__(self, backend: Backend, device: str) -> None:
        import torch

        self._backend = backend
        self.device = torch.device(device)
        self.kind = self.device.type

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


def stand_in(backend: Backend) -> Backend:
    """`backend`, or its stand-in on `Backend.fake_tensor_device` where it names one."""
    if backend.fake_tensor_device is None:
        return backend
    return cast(Backend, _StandIn(backend, backend.fake_tensor_device))


def _recording(tracker_class: Any, kind: str) -> Any:
    """`tracker_class`, also keeping every change of a storage on a device of `kind` in order:
    the tracker reports each through its `_update_snap` (torch 2.13): allocations, frees and
    resizes (FSDP2 frees its gathered parameters by one)."""

    class Recording(tracker_class):  # a class of torch's private module
        timed = False

        def __init__(self, *args: Any) -> None:
            self.changes: list[Change] = []
            super().__init__(*args)

        def _pre_fw_hook(self, module: Any, inputs: Any) -> None:
            # Micro-batches forward the whole model k times a step, which the tracker refuses as "multiple
            # iterative calls"; its per-module stats are not read here (only the device's peak, kept apart),
            # so a root module's second forward starts them afresh, as its message suggests.
            name = self._mod_tracker.get_known_fqn(module)
            is_root = set(self._mod_tracker.parents) - {name} == {"Global"}
            if module in self.memory_tracking and not self._mod_tracker.is_bw and is_root:
                self.reset_mod_stats()
            super()._pre_fw_hook(module, inputs)

        def _update_peak_stats(self, peak_state: Any) -> None:
            # Only the device's peak is read. torch's own also keeps every module's peak, walking
            # every module at every operator: 21 s of a 16-layer decoder's 33 s estimate.
            for device, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(device, 0) < snap[TOTAL]:
                    self._peak_mem[device] = snap[TOTAL]
                    self._peak_mem_snap[device] = dict(snap)

        def _update_snap(self, u_type: Any, winfo: Any, old_mem_consumed: Any = None, old_reftype: Any = None) -> None:
            super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)
            if winfo.device.type != kind or u_type.name == "REF":
                return
            before = {"ADD": 0, "DEL": winfo.mem_consumed, "SIZE": old_mem_consumed}[u_type.name]
            after = 0 if u_type.name == "DEL" else winfo.mem_consumed
            self.changes.append(Change(id(winfo), before, after, self.timed))

    return Recording


TOTAL = "Total"  # the tracker's key of a snapshot's sum
# The tracker's categories (its reference types' values) that a compiled step may hold less of.
TRANSIENT = ("Activation", "Temp", "All Gather", "Reduce Scatter")


def _is_fsdp2(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def over_limit(estimate: MemoryEstimate, limit_bytes: int | None, source: str, compiled: bool = False) -> str | None:
    """Why a step with `estimate` cannot fit `limit_bytes` (named by `source`), or None. A
    `compiled` step is judged by its floor alone: the eager activations it stands on are no
    bound on a compiler's, so only memory no compiler frees refuses it."""
    if estimate.step_bytes is None or not limit_bytes:
        return None
    judged = estimate.arena_bytes + (
        estimate.floor_bytes
        if compiled and estimate.floor_bytes is not None
        else estimate.step_bytes + estimate.retained_bytes
    )
    if judged + estimate.in_use_bytes <= limit_bytes:
        return None
    what = "its parameters, gradients, optimizer state and batch" if compiled else "the step on fake tensors"
    if not compiled and estimate.retained_bytes:
        what += " and the freed heap malloc keeps"
    if estimate.arena_bytes:
        what += " and the collectives' buffers"
    return (
        f"would not fit: estimated peak memory {(judged + estimate.in_use_bytes) / 2**30:.2f} GiB "
        f"({what} {judged / 2**30:.2f} GiB + {estimate.in_use_bytes / 2**30:.2f} GiB in use) "
        f"> {limit_bytes / 2**30:.2f} GiB ({source})"
    )


# torch.compile backends that fuse a compiled loss as `fused_loss.py` says; measured on inductor
# only (TorchTPU's `tpu` leaves it to XLA's own buffer assignment: not measured, estimated eagerly).
FUSING_BACKENDS = ("inductor",)


def fuses_loss(candidate: Candidate, device_kind: str) -> bool:
    """Whether `candidate`'s training step compiles its loss with the model on a backend that
    fuses it (`fused_loss.py`): its estimate then holds the fused loss's memory, not eager's."""
    options = compile_options(candidate[ExecutionKnob.name])
    return options is not None and options["backend"] in FUSING_BACKENDS and candidate.compiles_loss(device_kind)


def memory_key(candidate: Candidate, batch_size: int | None, seq_len: int | None, device_kind: str) -> Hashable:
    """What a step's estimate depends on: the batch, the knobs' values that change memory (a
    `LeavesMemory` knob's neutral values left out, so trials differing only in them share one)
    and whether the loss is fused (`fuses_loss`: the execution and compile scope it depends on
    leave memory as they are otherwise)."""

    def neutral(name: str, value: str) -> bool:
        knob = registry.get(name)
        return isinstance(knob, kinds.LeavesMemory) and knob.leaves_memory(value)

    changed = tuple(sorted((n, v) for n, v in candidate.changed.items() if not neutral(n, v)))
    return batch_size, seq_len, changed, fuses_loss(candidate, device_kind)


def cached_estimate(
    workload: Workload,
    backend: Backend,
    candidate: Candidate,
    batch_size: int | None,
    seq_len: int | None,
    cache: dict[Hashable, MemoryEstimate] | None,
) -> MemoryEstimate:
    """`estimate_step_memory`, kept in `cache` by `memory_key`; a kept one is reused with what the
    process holds now (the step's own bytes do not change between trials of one worker)."""
    key = memory_key(candidate, batch_size, seq_len, backend.kind)
    kept = cache.get(key) if cache is not None else None
    if kept is not None:
        return replace(as_of_now(kept, backend), seconds=0.0)
    estimate = estimate_step_memory(workload, backend, candidate, batch_size, seq_len)
    log.info("memory estimate of %s: %.2f s", candidate.describe() or "the baseline", estimate.seconds)
    if cache is not None:
        cache[key] = estimate
    return estimate


def estimate_or_refuse(
    workload: Workload,
    backend: Backend,
    candidate: Candidate,
    batch_size: int | None,
    seq_len: int | None,
    limit_bytes: int | None,
    source: str,
    cache: dict[Hashable, MemoryEstimate] | None = None,
) -> MemoryEstimate:
    """The step's estimate (the largest rank's: every rank takes part; `cached_estimate`), raising
    `WouldNotFit` where it cannot fit `limit_bytes`; without one, the device's memory where it
    bounds trials, else the memory the process may still take (CPU: what it holds + the host's
    available). A rank of a sharded trial finds its estimate in `cache`, made before it joined
    its group (runner/rank_job.py): on a joined group the fake step cannot run."""
    estimate = cached_estimate(workload, backend, candidate, batch_size, seq_len, cache)
    if backend.ranks > 1:  # every rank decides alike: the largest shard's estimate
        step = int(backend.max_over_ranks(-1 if estimate.step_bytes is None else estimate.step_bytes))
        floor = int(backend.max_over_ranks(-1 if estimate.floor_bytes is None else estimate.floor_bytes))
        in_use = int(backend.max_over_ranks(estimate.in_use_bytes))
        retained = int(backend.max_over_ranks(estimate.retained_bytes))
        arenas = int(backend.max_over_ranks(estimate.arena_bytes))
        reason = estimate.reason or ("another rank's step does not run on fake tensors" if step < 0 else None)
        estimate = MemoryEstimate(
            None if step < 0 else step,
            in_use,
            reason,
            estimate.seconds,
            None if floor < 0 else floor,
            retained,
            arena_bytes=arenas,
        )
    if not limit_bytes:
        if backend.memory_bounds_trials:
            limit_bytes, source = backend.info().memory_bytes, "the device's memory"
        else:
            available = backend.available_memory_bytes(None)
            limit_bytes = available + estimate.in_use_bytes if available else None
            source = "the memory available to the process"
    reason = over_limit(estimate, limit_bytes, source, compiled=candidate.compiles())
    if reason is not None:
        raise WouldNotFit(reason)
    return estimate
