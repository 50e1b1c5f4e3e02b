"""The output of an inference layout, put back together: the global batch's output on every rank.

Under a layout each rank runs the slice of the global batch of its (data, fsdp) coordinate, and
the ranks of one tensor group run the same slice (`apply.batch_shard`). `gather_batch` is the
inverse of that split: every output tensor whose first dimension is the slice's is all-gathered
over the ranks and the slices concatenated in batch order, one rank of each tensor group taken.
What the accuracy guardrail compares with one device's output of the whole batch, and what a
user's script calls where it wants the whole output in one place (serving itself need not: each
rank answers its own slice).
"""

from __future__ import annotations

from typing import Any

from tpu_tuner.model.meshes.layouts import Layout


def gather_batch(output: Any, layout: Layout, local_batch: int | None) -> Any:
    """`output` of this rank's slice (`local_batch` samples) as the whole global batch's: tensors,
    dicts (a transformers ``ModelOutput`` too, as a plain dict) and tuples / lists of them.
    Tensors whose first dimension is not the slice's, and everything under one slice, stay as
    they are; a DTensor is made whole first. Every rank must call it (it all-gathers)."""
    import torch

    def visit(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return _gather(_whole(value), layout, local_batch)
        if isinstance(value, dict):
            return {key: visit(item) for key, item in value.items()}
        if isinstance(value, (tuple, list)):
            return [visit(item) for item in value]
        return value

    return visit(output)


def _whole(tensor: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _gather(tensor: Any, layout: Layout, local_batch: int | None) -> Any:
    """The slices of every batch shard, in order: the first rank of each tensor group's."""
    if layout.batch_shards == 1 or local_batch is None or tensor.dim() == 0 or tensor.shape[0] != local_batch:
        return tensor
    import torch
    import torch.distributed as dist

    # Half-precision floats travel as float32 (exactly), which every backend gathers (gloo too).
    local = (tensor.detach().float() if tensor.is_floating_point() else tensor.detach()).contiguous()
    pieces = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, local)
    return torch.cat([pieces[shard * layout.tensor] for shard in range(layout.batch_shards)]).to(tensor.dtype)
