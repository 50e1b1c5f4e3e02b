"""A sharded step timed on every rank (training, or an inference forward): the trial's own step
(`execution/step.py`) under the layout, warmed up and timed as a trial is (`execution/timer.py`),
plus what a layout changes per rank: its peak memory over the timed steps and the model state it
holds.

Run as a `ShardedStepRequest` through `RankedTrialRunner` (ranks started by the launcher,
`runner/rank_job.py`). Every block of steps starts and ends on a barrier (`StepClock`), so a
step's figure is the slowest rank's. The state bytes are the parameters and optimizer state a rank holds after
the timed steps (local shards; each step's zero_grad frees the gradients): on a CPU the resident
set is mostly the interpreter, torch and activations, so the state is where sharding's saving shows.
"""

from __future__ import annotations

from typing import Any

import torch

from tpu_tuner.devices.base import Backend
from tpu_tuner.execution.step import prepare_step
from tpu_tuner.execution.timer import StepClock, time_steps, warm_up
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.model.workloads.batch import batch_size_of
from tpu_tuner.runner.requests import ShardedStepRequest, ShardedStepTiming


def run_sharded_step(state: Any, request: ShardedStepRequest) -> ShardedStepTiming:
    """Warm up, then time `request.steps` steps of the workload's step (a training step, or an
    inference forward on each rank's slice) on `request.layout`, in a rank's worker `state`
    (`runner.jobs.WorkerState`)."""
    workload, backend = state.workload, state.backend
    candidate = Candidate(layout=request.layout)
    with candidate.process(backend):
        step = prepare_step(workload, backend, candidate, request.batch_size)
        clock = StepClock.of(step, backend)
        warm_up(clock, request.warmup_steps, request.warmup_steps)
        backend.reset_peak_memory()  # the timed steps' peak, not the build's
        timing, _ = time_steps(clock, request.steps, 0.0, request.steps)
        peak, _ = backend.peak_memory_bytes()
        per_rank = _gather(backend, [float(peak or 0), float(_state_bytes(step.model, step.optimizer))])
    return ShardedStepTiming(
        step_seconds=list(timing.samples),
        peak_bytes=[int(r[0]) for r in per_rank],
        state_bytes=[int(r[1]) for r in per_rank],
        local_batch=int(batch_size_of(step.batch[0]) or 0),
    )


def _gather(backend: Backend, values: list[float]) -> list[list[float]]:
    """`values` of every rank, in rank order (this process's alone when it is the only rank)."""
    if backend.ranks == 1:
        return [values]
    import torch.distributed as dist

    mine = torch.tensor(values, dtype=torch.float64, device=backend.collective_device())
    gathered = [torch.zeros_like(mine) for _ in range(backend.ranks)]
    dist.all_gather(gathered, mine)
    return [[float(v) for v in tensor.tolist()] for tensor in gathered]


def _state_bytes(model: Any, optimizer: Any) -> int:
    """Bytes of the parameters, gradients and optimizer state this rank holds (local shards of
    DTensors; a tied parameter once)."""
    from torch.distributed.tensor import DTensor

    def local(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to_local() if isinstance(tensor, DTensor) else tensor

    total, seen = 0, set()
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += local(p).nbytes + (local(p.grad).nbytes if p.grad is not None else 0)
        for value in (optimizer.state.get(p, {}) if optimizer is not None else {}).values():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                total += local(value).nbytes
    return total
