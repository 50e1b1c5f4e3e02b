"""A sharded trial's per-rank memory, estimated before the rank joins its real process group.

A rank of a sharded trial (runner/rank_job.py) cannot estimate on fake tensors once it has joined
its real group: a real group's collectives need real tensors. So it estimates first, on torch's
communication-free fake process group (``torch.testing._internal.distributed.fake_pg``, torch
2.13), where FSDP2 and tensor-parallel layouts shard as they will for real and their tracker
sees the rank's own shards, and then leaves that group. DDP cannot be built there (its
constructor reads parameter data and builds its buckets in C++), so a DDP rank stands in as the
unsharded model on the rank's slice of the batch plus one flat copy of its gradients (DDP's
buckets hold one; docs/tuning.md, "Memory before measurement"). On gloo, the fake group's
collectives allocate what gloo's will (`gloo_buffers.py`: the reduce-scatter's copy of its input
in the step, the buffers its worker threads keep in their arenas as `arena_bytes`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace

from tpu_tuner.devices.base import Backend
from tpu_tuner.execution.gloo_buffers import GLOO_THREADS, WorkerBuffers, as_gloo
from tpu_tuner.execution.memory_estimate import MemoryEstimate, estimate_step_memory
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.layout import SINGLE, LayoutKnob, layout_in
from tpu_tuner.model.workloads.workload import Workload


def estimate_rank_memory(
    workload: Workload,
    backend: Backend,
    candidate: Candidate,
    batch_size: int | None,
    seq_len: int | None,
    rank: int,
    ranks: int,
) -> MemoryEstimate:
    """Rank `rank`'s estimate of `candidate`'s step over `ranks` ranks, made on the fake process
    group (joined and left here: call it before the real one); the reason where there is none."""
    layout = layout_in(candidate)
    if workload.is_training and layout.data > 1 and layout.fsdp == 1 and layout.tensor == 1:
        return _ddp_stand_in(workload, backend, candidate, batch_size, seq_len, layout.data)
    try:
        with fake_group(rank, ranks) as joined, _real_collectives(backend) as workers:
            if not joined:
                return MemoryEstimate(None, reason="a process group was joined before the estimate")
            estimate = estimate_step_memory(workload, backend, candidate, batch_size, seq_len)
            if workers is None or estimate.step_bytes is None:
                return estimate
            return replace(estimate, arena_bytes=workers.arena_bytes())
    except Exception as exc:  # the group itself (the estimate returns its reasons): the trial runs without one
        return MemoryEstimate(None, reason=f"torch's fake process group failed ({type(exc).__name__}: {exc})")


def _ddp_stand_in(
    workload: Workload,
    backend: Backend,
    candidate: Candidate,
    batch_size: int | None,
    seq_len: int | None,
    replicas: int,
) -> MemoryEstimate:
    """The unsharded step on one replica's slice of the batch, plus a flat copy of the gradients."""
    whole = batch_size or workload.batch_size
    if whole is None or whole % replicas:
        return MemoryEstimate(None, reason=f"DDP over {replicas} ranks: the batch of {whole} has no equal slice")
    single = Candidate({**candidate.changed, LayoutKnob.name: SINGLE})
    estimate = estimate_step_memory(workload, backend, single, whole // replicas, seq_len)
    if estimate.step_bytes is None:
        return estimate
    buckets = _gradient_bytes(workload)
    return replace(
        estimate,
        step_bytes=estimate.step_bytes + buckets,
        floor_bytes=None if estimate.floor_bytes is None else estimate.floor_bytes + buckets,
    )


def _gradient_bytes(workload: Workload) -> int:
    """The bytes of the model's trainable parameters (their gradients' size), built on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        model = workload.build_model()
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


@contextlib.contextmanager
def _real_collectives(backend: Backend) -> Iterator[WorkerBuffers | None]:
    """The fake group's collectives allocating as the real group's will (gloo: `gloo_buffers.py`);
    None where the real group is another (an accelerator's collectives allocate on its device)."""
    if backend.process_group_backend != "gloo":
        yield None
        return
    with as_gloo(GLOO_THREADS) as workers:
        yield workers


@contextlib.contextmanager
def fake_group(rank: int, ranks: int) -> Iterator[bool]:
    """torch's fake process group of `ranks` ranks as this process's default group for the
    block (False, and nothing joined, where a group is joined already)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        yield False
        return
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=ranks)
    try:
        yield True
    finally:
        dist.destroy_process_group()
