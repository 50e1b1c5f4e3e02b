"""Time a sharded training step on the ranks of one process group.

    python -m tpu_tuner.runner.sharded_measure MODEL.py DATAxFSDPxTENSOR [--batch-size N] [--steps K]
    (started by `measure_layout`, through `launch.run_ranks`)

Each rank builds the model from the same seed, applies the layout, and runs warm-up steps, then
`--steps` timed steps (forward, backward, AdamW step, zero_grad) on its slice of the global
batch. Every step starts on a barrier, so a step's time is the slowest rank's: the report holds,
per step, the maximum over ranks; and per rank its peak resident memory (VmHWM) and its model
state: the bytes of the parameters and optimizer state it holds after the timed steps (local
shards; gradients are freed by each step's zero_grad). On a
CPU the resident set is mostly the interpreter, torch and activations, and freed memory stays in
it, so the state bytes are where sharding's saving shows (FSDP holds 1/N of each).
"""

from __future__ import annotations

import time
from pathlib import Path

from tpu_tuner.runner.launch import RanksResult, finish_rank, run_ranks, write_report
from tpu_tuner.runner.rank_step import prepare_rank_step, rank_arguments

WARMUP_STEPS = 2


def measure_layout(model_file: str | Path, layout: str, nproc: int, batch_size: int | None = None,
                   steps: int = 10, timeout_s: float = 600.0) -> RanksResult:
    """Run the timing on `nproc` ranks; rank 0's report has ``step_seconds`` (slowest rank per
    step) and ``peak_bytes`` (per rank)."""
    args = [str(model_file), layout, f"--steps={steps}"] + ([f"--batch-size={batch_size}"] if batch_size else [])
    return run_ranks(nproc, "tpu_tuner.runner.sharded_measure", args, timeout_s)


def main(argv: list[str] | None = None) -> None:
    parser = rank_arguments(__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    from tpu_tuner.devices.cpu import CpuBackend
    from tpu_tuner.parallel.apply import apply_layout
    from tpu_tuner.model.workload import call_model

    prepared = prepare_rank_step(args.model_file, args.layout, args.batch_size)
    rank, world, workload = prepared.rank, prepared.world, prepared.workload
    inputs, target = prepared.local_inputs, prepared.local_target
    model = apply_layout(prepared.model, prepared.layout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> float:
        dist.barrier()
        start = time.perf_counter()
        workload.loss_fn(call_model(model, inputs), target).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        dist.barrier()  # the step ends when the slowest rank's does
        return time.perf_counter() - start

    backend = CpuBackend()
    for _ in range(WARMUP_STEPS):
        step()
    backend.reset_peak_memory()  # the timed steps' peak, not the build's
    times = torch.tensor([step() for _ in range(args.steps)], dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    mine = torch.tensor([float(backend.peak_memory_bytes()[0] or 0), float(_state_bytes(model, optimizer))],
                        dtype=torch.float64)
    gathered = [torch.zeros(2, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(gathered, mine)
    report = {"rank": rank, "layout": args.layout, "local_batch": prepared.local_batch}
    if rank == 0:
        report["step_seconds"] = [float(t) for t in times]
        report["peak_bytes"] = [int(g[0].item()) for g in gathered]
        report["state_bytes"] = [int(g[1].item()) for g in gathered]
    write_report(report)
    finish_rank()


def _state_bytes(model: object, optimizer: object) -> int:
    """Bytes of the parameters, gradients and optimizer state this rank holds (local shards of
    DTensors; a tied parameter once)."""
    import torch
    from torch.distributed.tensor import DTensor

    def local(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to_local() if isinstance(tensor, DTensor) else tensor

    total, seen = 0, set()
    for p in model.parameters():  # type: ignore[attr-defined]
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += local(p).nbytes + (local(p.grad).nbytes if p.grad is not None else 0)
        for value in optimizer.state.get(p, {}).values():  # type: ignore[attr-defined]
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                total += local(value).nbytes
    return total


if __name__ == "__main__":
    main()
