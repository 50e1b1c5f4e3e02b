"""The numerics guardrail of a sharded step (training or inference), run as the ranks of one process group.

    python -m tpu_tuner.runner.sharded_check MODEL.py DATAxFSDPxTENSOR|CONFIG.toml [--batch-size N]
    (started by `check_layout`, through `launch.run_ranks`)

Every rank builds the model from the same seed; rank 0 first runs the single-device fp32 step on
the whole global batch (the reference). Then the layout is applied (`parallel.apply.apply_layout`), each
rank runs forward and backward on its slice of the batch, and the loss (averaged over ranks) and
every parameter's gradient (gathered from its shards) are compared on rank 0 with the reference,
as the accuracy guardrail compares precision settings: relative error of the loss and of all
gradients concatenated in parameter order. Given a tuned or sharding config (``.toml``, e.g. the
planner's sharding_config.toml) instead of a layout, the ranks shard through `tpu_tuner.apply`,
as a user's script would, and the same comparison checks it.

An inference file (no loss) runs its forward alone, without grad: the single-device output of
the whole batch against the ranks' outputs, each rank's slice gathered in batch order
(`parallel.inference.gather_batch`; the ranks of a tensor group hold the same slice whole).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_tuner.execution.accuracy import Outputs, relative_error, whole
from tpu_tuner.model.meshes.layouts import Layout
from tpu_tuner.runner.launch import RanksResult, finish_rank, init_rank, run_ranks, write_report

SEED = 0


@dataclass
class RankStep:
    """One rank's model (not yet sharded), the global batch and its own slice of it."""

    rank: int
    world: int
    layout: Layout
    workload: Any  # tpu_tuner.model.workloads.workload.Workload
    model: Any  # nn.Module, built from SEED
    inputs: Any
    target: Any
    local_inputs: Any
    local_target: Any

    @property
    def local_batch(self) -> int:
        from tpu_tuner.model.workloads.batch import batch_size_of

        return int(batch_size_of(self.local_inputs) or 0)


def layout_of(text: str) -> Layout:
    """A layout string, or the [sharding.mesh] of a tuned / planned config file."""
    from tpu_tuner.parallel.apply import parse_layout

    if not text.endswith(".toml"):
        return parse_layout(text)
    from tpu_tuner.knobs.layout import layout_in
    from tpu_tuner.knobs.tuned_config import TunedConfig

    return layout_in(TunedConfig.load(text).candidate)


def prepare_rank_step(model_file: str, layout_text: str, batch_size: int | None) -> RankStep:
    """Join the group and build this rank's step inputs (an inference file's target is None);
    exits with the reason when the layout cannot run the model."""
    import torch

    from tpu_tuner.model.workloads.batch import batch_slice
    from tpu_tuner.model.workloads.loader import load_workload
    from tpu_tuner.parallel.apply import batch_shard, why_not

    rank, world = init_rank()
    layout = layout_of(layout_text)
    workload = load_workload(model_file)
    torch.manual_seed(SEED)
    model = workload.build_model()
    model.train(workload.is_training)  # as a trial's step runs it (prepare_step)
    batch = batch_size or workload.batch_size or 8
    reason = why_not(model, layout, world, batch, inference=not workload.is_training)
    if reason:
        raise SystemExit(f"layout {layout_text}: {reason}")
    torch.manual_seed(SEED + 1)
    inputs, target = workload.split_batch(workload.batch(batch))
    shard = batch_shard(layout, rank)
    # Tensors, tuples or dicts of them (a transformers model's input_ids and labels) alike.
    local_inputs, local_target = (batch_slice(t, batch, layout.batch_shards, shard) for t in (inputs, target))
    return RankStep(rank, world, layout, workload, model, inputs, target, local_inputs, local_target)


def check_layout(
    model_file: str | Path, layout: str, nproc: int, batch_size: int | None = None, timeout_s: float = 300.0
) -> RanksResult:
    """Run the check on `nproc` ranks; rank 0's report has ``loss_error`` and ``gradient_error``
    (a training step) or ``output_error`` (an inference step)."""
    args = [str(model_file), layout] + ([f"--batch-size={batch_size}"] if batch_size else [])
    return run_ranks(nproc, "tpu_tuner.runner.sharded_check", args, timeout_s)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])  # MODEL.py LAYOUT [--batch-size N]
    parser.add_argument("model_file")
    parser.add_argument("layout", help="DATAxFSDPxTENSOR, or a config .toml with [sharding.mesh]")
    parser.add_argument("--batch-size", type=int)
    args = parser.parse_args(argv)

    import copy

    import torch.distributed as dist

    from tpu_tuner.knobs.tuned_config import apply_sharding
    from tpu_tuner.model.workloads.workload import call_model
    from tpu_tuner.parallel.apply import apply_layout

    step = prepare_rank_step(args.model_file, args.layout, args.batch_size)
    if not step.workload.is_training:
        _check_inference(step, args.layout)
        return
    workload = step.workload
    reference: dict[str, Any] | None = None
    if step.rank == 0:
        single = copy.deepcopy(step.model)
        loss = workload.loss_fn(call_model(single, step.inputs), step.target)
        loss.backward()
        reference = {"loss": loss.detach(), "gradients": _flat_gradients(single.parameters())}
    dist.barrier()

    # A config file shards as `tpu_tuner.apply` does (its other settings are for its own device,
    # a plan's are TPU's, and the precision guardrail's to check); a layout string directly.
    sharded = (
        apply_sharding(step.model, args.layout, training=True)
        if args.layout.endswith(".toml")
        else apply_layout(step.model, step.layout)
    )
    loss = workload.loss_fn(call_model(sharded, step.local_inputs), step.local_target)
    loss.backward()
    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss)
    mean_loss /= step.world  # ranks of one tensor group hold the same slice: every slice counts equally
    parameters = getattr(sharded, "module", sharded).parameters()  # inside a DDP wrapper, or the model itself
    gradients = _flat_gradients(parameters)  # gathers DTensor shards: every rank takes part
    report: dict[str, Any] = {"rank": step.rank, "layout": args.layout, "local_batch": step.local_batch}
    if reference is not None:
        report["loss"] = float(mean_loss)
        report["reference_loss"] = float(reference["loss"])
        # The precision guardrail's own comparison (execution/accuracy.py), part by part.
        errors = relative_error(
            Outputs({"loss": mean_loss.float().reshape(1), "gradients": gradients}),
            Outputs({"loss": reference["loss"].float().reshape(1), "gradients": reference["gradients"]}),
        )
        report["loss_error"], report["gradient_error"] = errors["loss"], errors["gradients"]
        # The largest absolute differences beside the relative errors, for reports that quote them.
        report["loss_abs_diff"] = abs(float(mean_loss) - float(reference["loss"]))
        report["gradient_max_abs_diff"] = float((gradients - reference["gradients"]).abs().max())
    write_report(report)
    finish_rank()


def _check_inference(step: RankStep, layout: str) -> None:
    """The forward alone: rank 0's single-device output of the whole batch, then every rank's
    output of its slice under the layout, gathered in batch order and compared on rank 0."""
    import copy

    import torch
    import torch.distributed as dist

    from tpu_tuner.execution.accuracy import flatten_output
    from tpu_tuner.knobs.tuned_config import apply_sharding
    from tpu_tuner.model.workloads.workload import call_model
    from tpu_tuner.parallel.apply import apply_layout
    from tpu_tuner.parallel.inference import gather_batch

    reference = None
    if step.rank == 0:
        with torch.no_grad():
            reference = flatten_output(call_model(copy.deepcopy(step.model), step.inputs))
    dist.barrier()
    sharded = (
        apply_sharding(step.model, layout, training=False)
        if layout.endswith(".toml")
        else apply_layout(step.model, step.layout, inference=True)
    )
    with torch.no_grad():
        output = call_model(sharded, step.local_inputs)
    gathered = flatten_output(gather_batch(output, step.layout, step.local_batch))  # every rank takes part
    report: dict[str, Any] = {"rank": step.rank, "layout": layout, "local_batch": step.local_batch}
    if reference is not None:
        report["output_error"] = relative_error(Outputs({"output": gathered}), Outputs({"output": reference}))["output"]
        report["output_max_abs_diff"] = (
            float((gathered - reference).abs().max()) if gathered.shape == reference.shape else float("inf")
        )
    write_report(report)
    finish_rank()


def _flat_gradients(parameters: Any) -> Any:
    """Every parameter's gradient whole (zeros where it has none), flat, in parameter order."""
    import torch

    return torch.cat(
        [whole(p.grad).detach().float().flatten() if p.grad is not None else torch.zeros(p.numel()) for p in parameters]
    )


if __name__ == "__main__":
    main()
