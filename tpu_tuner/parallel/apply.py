"""Apply a data x fsdp x tensor layout to a model on the current process group.

One function for every caller (the ranks of a trial, the numerics check, a user's script): the
planner's `Layout` names the mesh, and the placements come from the model's structure as the
planner derives them (`model.layouts.placements`):

* ``tensor`` > 1: inside each repeated block, column-wise linears become `ColwiseParallel`,
  row-wise ones `RowwiseParallel` (DTensor `parallelize_module`), and the block's head-count
  attributes are divided by the tensor size so its reshapes see the local heads (as torchtitan
  does). Embeddings and the output head stay replicated;
* ``fsdp`` > 1: FSDP2 `fully_shard` on each repeated block, then on the root (HSDP, replicate x
  shard, when ``data`` > 1 too);
* ``data`` only: `DistributedDataParallel`.

A Hugging Face transformers model splits as it declares (`parallel/hf.py`): tensor parallelism
by its own ``tp_plan`` through transformers' ``apply_tensor_parallelism``, FSDP on its
``_no_split_modules`` blocks; every rank first takes rank 0's weights.

Layouts this cannot run are refused with the reason (`LayoutError`) before anything is sharded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpu_tuner.model import layouts
from tpu_tuner.model.layouts import Layout, placements, why_not_ranks
from tpu_tuner.model.structure import HEAD_ATTRS, KV_HEAD_ATTRS, token_embedding
from tpu_tuner.parallel import hf
from tpu_tuner.parallel.errors import LayoutError

if TYPE_CHECKING:
    from torch import nn

# Attributes holding a head count that a block's forward reshapes by: the ones the planner reads.
HEAD_COUNT_ATTRS = HEAD_ATTRS + KV_HEAD_ATTRS


def parse_layout(text: str) -> Layout:
    """``"DATAxFSDPxTENSOR"`` (e.g. ``"1x2x1"``) as a `Layout` (the layout knob's syntax), a bad
    one refused as a `LayoutError`."""
    try:
        return layouts.parse_layout(text, context=False)
    except ValueError as exc:
        raise LayoutError(str(exc)) from None


def why_not(model: nn.Module, layout: Layout, world_size: int, batch_size: int | None) -> str | None:
    """Why `layout` cannot run `model` on `world_size` ranks with a global batch of
    `batch_size`; None where it can."""
    from tpu_tuner.model.blocks import repeated_blocks

    if hf.is_hf_model(model):
        if layout.tensor > 1 and (reason := hf.why_not_tensor(model, layout.tensor)):
            return reason
        blocks = len(hf.shard_blocks(model))
    else:
        blocks = len(repeated_blocks(model))
    widths = tensor_widths(model) if layout.tensor > 1 else {}
    return why_not_ranks(layout, world_size, batch_size, blocks, widths)


def tensor_widths(model: nn.Module) -> dict[str, int]:
    """What a tensor axis must divide, by name: the sharded width of every column- or row-wise
    linear layer of the repeated blocks (the planner's placements) and their head counts; for a
    transformers model, its plan's split widths and head counts (`hf.tensor_widths`)."""
    from torch import nn

    if hf.is_hf_model(model):
        return hf.tensor_widths(model)

    from tpu_tuner.model.blocks import repeated_blocks

    plan = placements(model, _residual_width(model))
    in_blocks = {id(m) for block in repeated_blocks(model) for m in block.modules()}
    widths: dict[str, int] = {}
    for name, module in model.named_modules():
        if id(module) not in in_blocks:
            continue
        kind = plan.get(f"{name}.weight") if isinstance(module, nn.Linear) else None
        if kind in ("colwise", "rowwise"):
            widths[f"{name}'s width"] = module.out_features if kind == "colwise" else module.in_features
        for attr in HEAD_COUNT_ATTRS:
            count = getattr(module, attr, None)
            if isinstance(count, int):
                widths[f"{name}.{attr}"] = count
    return widths


def mesh_device_type() -> str:
    """The device type of this process group's backend (gloo runs on CPU tensors)."""
    import torch.distributed as dist

    backend = dist.get_backend()
    return "cpu" if backend == "gloo" else "cuda" if backend == "nccl" else "tpu"


def apply_layout(model: nn.Module, layout: Layout, device_type: str = "cpu") -> nn.Module:
    """Shard `model` (in place where the APIs allow; use the returned module) over the default
    process group, which must have `layout.devices` ranks."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world_size = dist.get_world_size()
    if layout.devices != world_size:
        raise LayoutError(f"layout {layout.short()} needs {layout.devices} ranks, not {world_size}")
    if layout.devices == 1:
        return model
    if layout.fsdp == 1 and layout.tensor == 1:
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    from_hf = hf.is_hf_model(model)
    if from_hf and layout.tensor > 1 and (reason := hf.why_not_tensor(model, layout.tensor)):
        raise LayoutError(f"layout {layout.short()}: {reason}")  # before a head is split across ranks
    names = ("data", "fsdp", "tensor")
    sizes = (layout.data, layout.fsdp, layout.tensor)
    if device_type == "tpu":
        from tpu_tuner.devices.torchtpu import tpu_device_mesh

        mesh = tpu_device_mesh(sizes, names)  # ICI-aware rank order
    else:
        mesh = init_device_mesh(device_type, sizes, mesh_dim_names=names)
    if from_hf:
        hf.same_weights_as_rank_zero(model)
    if layout.tensor > 1:
        if from_hf:
            hf.apply_tensor_plan(model, mesh["tensor"])
        else:
            _tensor_parallel(model, mesh["tensor"], layout.tensor)
    if layout.fsdp > 1:
        from torch.distributed.fsdp import fully_shard

        from tpu_tuner.model.blocks import repeated_blocks

        dp_mesh = mesh["data", "fsdp"] if layout.data > 1 else mesh["fsdp"]
        for block in hf.shard_blocks(model) if from_hf else repeated_blocks(model):
            fully_shard(block, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
    return model


def batch_shard(layout: Layout, rank: int) -> int:
    """Which of the `layout.batch_shards` slices of the global batch `rank` runs (ranks of one
    tensor-parallel group run the same slice; the mesh is data x fsdp x tensor, row-major)."""
    return rank // layout.tensor


def _tensor_parallel(model: nn.Module, tensor_mesh: object, size: int) -> None:
    from torch import nn
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from tpu_tuner.model.blocks import repeated_blocks

    plan = placements(model, _residual_width(model))
    names = {id(module): name for name, module in model.named_modules()}
    for block in repeated_blocks(model):
        prefix = names[id(block)]
        styles = {}
        for name, module in block.named_modules():
            kind = plan.get(f"{prefix}.{name}.weight") if isinstance(module, nn.Linear) else None
            if kind == "colwise":
                styles[name] = ColwiseParallel()
            elif kind == "rowwise":
                styles[name] = RowwiseParallel()
        parallelize_module(block, tensor_mesh, styles)
        for module in block.modules():
            for attr in HEAD_COUNT_ATTRS:
                count = getattr(module, attr, None)
                if isinstance(count, int):
                    setattr(module, attr, count // size)


def _residual_width(model: nn.Module) -> int:
    """The model's residual width: its token embedding's dimension (the planner's reading), else
    the first Linear's input width."""
    from torch import nn

    embedding = token_embedding(model)
    if embedding is not None:
        return embedding.embedding_dim
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    return linears[0].in_features if linears else 0
