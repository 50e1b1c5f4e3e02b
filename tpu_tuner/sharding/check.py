"""The numerics guardrail of a sharded training step, run as the ranks of one process group.

    python -m tpu_tuner.sharding.check MODEL.py DATAxFSDPxTENSOR|CONFIG.toml [--batch-size N]
    (started by `check_layout`, through `launch.run_ranks`)

Every rank builds the model from the same seed; rank 0 first runs the single-device fp32 step on
the whole global batch (the reference). Then the layout is applied (`apply.apply_layout`), each
rank runs forward and backward on its slice of the batch, and the loss (averaged over ranks) and
every parameter's gradient (gathered from its shards) are compared on rank 0 with the reference,
as the accuracy guardrail compares precision settings: relative error of the loss and of all
gradients concatenated in parameter order. Given a tuned or sharding config (``.toml``, e.g. the
planner's sharding_config.toml) instead of a layout, the ranks shard through `tpu_tuner.apply`,
as a user's script would, and the same comparison checks it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tpu_tuner.sharding.launch import RanksResult, finish_rank, init_rank, run_ranks, write_report

SEED = 0


def check_layout(model_file: str | Path, layout: str, nproc: int, batch_size: int | None = None,
                 timeout_s: float = 300.0) -> RanksResult:
    """Run the check on `nproc` ranks; rank 0's report has ``loss_error`` and ``gradient_error``."""
    args = [str(model_file), layout] + ([f"--batch-size={batch_size}"] if batch_size else [])
    return run_ranks(nproc, "tpu_tuner.sharding.check", args, timeout_s)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_file")
    parser.add_argument("layout")
    parser.add_argument("--batch-size", type=int)
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    from tpu_tuner.loader import load_workload
    from tpu_tuner.workload import call_model
    from tpu_tuner.sharding.apply import apply_layout, batch_shard, parse_layout, why_not

    rank, world = init_rank()
    config = None
    if args.layout.endswith(".toml"):
        from tpu_tuner.planner.layouts import Layout
        from tpu_tuner.tuned_config import TunedConfig

        config = TunedConfig.load(args.layout)
        mesh = (config.sharding or {}).get("mesh", {})
        layout = Layout(int(mesh.get("data", 1)), int(mesh.get("fsdp", 1)), int(mesh.get("tensor", 1)))
    else:
        layout = parse_layout(args.layout)
    workload = load_workload(args.model_file)
    if not workload.is_training:
        raise SystemExit(f"{args.model_file}: the sharded check needs a training step (the file declares no loss)")
    torch.manual_seed(SEED)
    model = workload.build_model()
    batch_size = args.batch_size or workload.batch_size or 8
    torch.manual_seed(SEED + 1)
    inputs, target = workload.split_batch(workload.batch(batch_size))
    reason = why_not(model, layout, world, batch_size)
    if reason:
        raise SystemExit(f"layout {args.layout}: {reason}")

    reference: dict[str, Any] | None = None
    if rank == 0:
        import copy

        single = copy.deepcopy(model)
        loss = workload.loss_fn(call_model(single, inputs), target)
        loss.backward()
        reference = {"loss": loss.detach(), "gradients": _flat_gradients(single.parameters())}
    dist.barrier()

    if config is not None:
        from tpu_tuner.tuned_config import apply_sharding

        # The sharding alone, as `tpu_tuner.apply` applies it: the config's other settings are
        # for its own device (a plan's are TPU's) and the precision guardrail's to check.
        sharded = apply_sharding(model, config)
    else:
        sharded = apply_layout(model, layout)
    shard, shards = batch_shard(layout, rank), layout.batch_shards
    size = batch_size // shards
    local_inputs, local_target = (t[shard * size:(shard + 1) * size] for t in (inputs, target))
    loss = workload.loss_fn(call_model(sharded, local_inputs), local_target)
    loss.backward()
    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss)
    mean_loss /= world  # ranks of one tensor group hold the same slice: every slice counts equally
    parameters = (sharded.module if hasattr(sharded, "module") else sharded).parameters()
    gradients = _flat_gradients(parameters)  # gathers DTensor shards: every rank takes part
    report: dict[str, Any] = {"rank": rank, "layout": args.layout, "local_batch": size}
    if rank == 0 and reference is not None:
        report["loss"] = float(mean_loss)
        report["reference_loss"] = float(reference["loss"])
        report["loss_error"] = _relative(mean_loss, reference["loss"])
        report["gradient_error"] = _relative(gradients, reference["gradients"])
    write_report(report)
    finish_rank()


def _flat_gradients(parameters: Any) -> Any:
    import torch
    from torch.distributed.tensor import DTensor

    parts = []
    for p in parameters:
        grad = p.grad
        if grad is None:
            parts.append(torch.zeros(p.numel()))
            continue
        if isinstance(grad, DTensor):
            grad = grad.full_tensor()
        parts.append(grad.detach().float().flatten())
    return torch.cat(parts)


def _relative(value: Any, reference: Any) -> float:
    import torch

    if value.shape != reference.shape:
        return float("inf")
    return float(torch.linalg.vector_norm(value.float() - reference.float()) /
                 torch.linalg.vector_norm(reference.float()).clamp_min(1e-30))


if __name__ == "__main__":
    main()
