"""The buffers gloo allocates for FSDP2's collectives, which torch's fake process group does not.

A rank estimates on the communication-free fake group (`rank_memory.py`); its step then runs on
gloo, whose collectives allocate beyond the tensors FSDP2 hands them (ProcessGroupGloo.cpp,
torch 2.13):

* **reduce-scatter** (`reduce_scatter_tensor_coalesced`) clones its whole input on the calling
  thread, all-reduces the clone and copies the rank's chunk out; the clone lives until the work
  is waited (FSDP2 waits at once). So the fake step clones the input here too: the tracker sees
  that storage, and the malloc replay (`malloc_replay.py`) places it on the main heap.
* **all-gather** (`AsyncAllgatherWork`) allocates a flat tensor of the whole output on the calling
  thread (`newLikeFlat` in its output tensors: the profiler shows an `aten::empty` of the output's
  size inside `c10d::_allgather_base_` on the main thread), held while the call runs (FSDP2's
  default all-gather waits at once), so the fake step allocates it too; and it gathers, on one of
  gloo's worker threads, into another flat tensor of the whole output before copying it into the
  caller's output. A worker thread allocates from an arena of its own (glibc gives each thread
  one, up to 8 a core), and what it frees stays there: the arena keeps at least its largest
  buffer, and over the warm-up every worker serves the largest (FSDP2's root group). So the
  estimate adds `threads x` the largest buffer below glibc's largest mmap threshold (a mapped one
  is returned when freed) as `arena_bytes`: a lower bound (an arena keeps more, and the
  reduce-scatter's all-reduce buffers on the worker threads are not modelled).

Measured on this host: docs/tuning.md, "Memory before measurement".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tpu_tuner.execution.heap_model import MMAP_THRESHOLD_MAX

# The worker threads of a gloo group joined with default options: `ProcessGroupGloo::Options`'
# `threads(2)` (its constructor in torch/csrc/distributed/c10d/ProcessGroupGloo.cpp, torch 2.13; no public reader).
GLOO_THREADS = 2


@dataclass
class WorkerBuffers:
    """The buffers gloo's worker threads allocate for the collectives recorded (bytes each)."""

    threads: int
    sizes: list[int] = field(default_factory=list)

    def arena_bytes(self) -> int:
        """What the worker threads' arenas keep: each its largest buffer, where glibc serves it
        from the arena (below its largest mmap threshold: a larger one is mapped and returned)."""
        kept = [size for size in self.sizes if size < MMAP_THRESHOLD_MAX]
        return self.threads * max(kept, default=0)


@contextlib.contextmanager
def as_gloo(threads: int) -> Iterator[WorkerBuffers]:
    """FSDP2's collectives (`dist.reduce_scatter_single`, `dist.all_gather_single`) allocating,
    for the block, what gloo allocates on the calling thread, and recording what its worker
    threads allocate. For a step on the fake process group that will run on gloo."""
    import torch.distributed as dist

    buffers = WorkerBuffers(threads)
    names = ("reduce_scatter_single", "all_gather_single")
    originals = {name: getattr(dist, name) for name in names}

    def reduce_scatter_single(output: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
        clone = input.clone()  # gloo's copy of the whole input, on this thread
        try:
            return originals["reduce_scatter_single"](output, input, *args, **kwargs)
        finally:
            del clone

    def all_gather_single(output: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
        flat = output.new_empty(output.shape)  # the work's flat output tensors, on this thread
        buffers.sizes.append(_nbytes(output))  # the flat output gathered into, on a worker thread
        try:
            return originals["all_gather_single"](output, input, *args, **kwargs)
        finally:
            del flat

    for function in (reduce_scatter_single, all_gather_single):  # FSDP2 reads `dist.<name>` at each call
        setattr(dist, function.__name__, function)
    try:
        yield buffers
    finally:
        for name, function in originals.items():
            setattr(dist, name, function)


def _nbytes(tensor: Any) -> int:
    return int(tensor.numel() * tensor.element_size())
