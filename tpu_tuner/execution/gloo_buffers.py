"""The buffers gloo allocates for FSDP2's collectives, which torch's fake process group does not.

A rank estimates on the communication-free fake group (`rank_memory.py`); its step then runs on
gloo, whose collectives allocate beyond the tensors FSDP2 hands them (ProcessGroupGloo.cpp, torch
2.13): a reduce-scatter clones its whole input, an all-gather allocates a flat tensor of its whole
output, both on the calling thread and held while the call runs, so the fake step allocates them
too (the tracker sees them, the malloc replay places them on the main heap). The all-gather also
gathers into another flat output on one of gloo's worker threads, whose arena keeps what it freed:
the estimate adds `threads x` the largest buffer below glibc's largest mmap threshold as
`arena_bytes`, a lower bound (the reduce-scatter's all-reduce buffers there are not modelled).
What was measured, and why each part: docs/tuning.md, "Memory before measurement".
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
