"""Apply a data x fsdp x tensor layout to a model on the current process group.

One function for every caller (the ranks of a trial, the numerics check, a user's script): the
planner's `Layout` names the mesh, and the placements come from the model's structure as the
planner derives them (`model.meshes.layouts.placements`):

* ``tensor`` > 1: inside each repeated block, column-wise linears become `ColwiseParallel`,
  row-wise ones `RowwiseParallel` (DTensor `parallelize_module`), and the block's head-count
  attributes are divided by the tensor size so its reshapes see the local heads (as torchtitan
  does). Embeddings and the output head stay replicated;
* ``fsdp`` > 1: FSDP2 `fully_shard` on each repeated block, then on the root (HSDP, replicate x
  shard, when ``data`` > 1 too);
* ``data`` only: `DistributedDataParallel`.

A model without repeated blocks (a plain MLP) splits its chains of linear layers instead: in a
``Sequential`` of linears with only elementwise activations between them, consecutive linears
pair up, the first column-wise and the second row-wise (Megatron's MLP split; `linear_pairs`).

An inference step (``inference=True``: a forward alone) has no gradient to synchronise, so its
data axis is plain replicas, every rank holding rank 0's weights (no DDP wrapper, whose forward
would only broadcast buffers), and data x tensor runs without fsdp.

A Hugging Face transformers model splits as it declares (`parallel/hf.py`): tensor parallelism
by its own ``tp_plan`` through transformers' ``apply_tensor_parallelism``, FSDP on its
``_no_split_modules`` blocks; every rank first takes rank 0's weights.

Layouts this cannot run are refused with the reason (`LayoutError`) before anything is sharded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from tpu_tuner.devices import backend_class, backend_classes
from tpu_tuner.model.meshes import layouts
from tpu_tuner.model.meshes.layouts import Layout, placements, why_not_ranks
from tpu_tuner.model.workloads.structure import HEAD_ATTRS, KV_HEAD_ATTRS, token_embedding
from tpu_tuner.parallel import hf
from tpu_tuner.parallel.errors import LayoutError

if TYPE_CHECKING:
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ParallelStyle

# Attributes holding a head count that a block's forward reshapes by: the ones the planner reads.
HEAD_COUNT_ATTRS = HEAD_ATTRS + KV_HEAD_ATTRS
# Set on a model an inference layout replicated over its data axis: the number of replicas.
REPLICAS_MARK = "_tpu_tune_replicas"


def _elementwise() -> tuple[type, ...]:
    from torch import nn

    # Modules that act on each feature alone, so each rank can run them on its own columns.
    return (
        nn.ReLU,
        nn.GELU,
        nn.SiLU,
        nn.Tanh,
        nn.Sigmoid,
        nn.LeakyReLU,
        nn.ELU,
        nn.Mish,
        nn.Hardswish,
        nn.Dropout,
        nn.Identity,
    )


def parse_layout(text: str) -> Layout:
    """``"DATAxFSDPxTENSOR"`` (e.g. ``"1x2x1"``) as a `Layout` (the layout knob's syntax), a bad
    one refused as a `LayoutError`."""
    try:
        return layouts.parse_layout(text, context=False)
    except ValueError as exc:
        raise LayoutError(str(exc)) from None


def why_not(
    model: nn.Module, layout: Layout, world_size: int, batch_size: int | None, inference: bool = False
) -> str | None:
    """Why `layout` cannot run `model` on `world_size` ranks with a global batch of
    `batch_size` (a training step, or a forward alone where `inference`); None where it can."""
    from tpu_tuner.model.workloads.blocks import repeated_blocks

    if hf.is_hf_model(model):
        if layout.tensor > 1 and (reason := hf.why_not_tensor(model, layout.tensor)):
            return reason
        blocks = len(hf.shard_blocks(model))
    else:
        blocks = len(repeated_blocks(model))
    widths = tensor_widths(model) if layout.tensor > 1 else {}
    return why_not_ranks(layout, world_size, batch_size, blocks, widths, inference)


def tensor_widths(model: nn.Module) -> dict[str, int]:
    """What a tensor axis must divide, by name: the sharded width of every column- or row-wise
    linear layer of the repeated blocks (the planner's placements) and their head counts (for a
    model without repeated blocks, the split width of each pair of `linear_pairs`); for a
    transformers model, its plan's split widths and head counts (`hf.tensor_widths`)."""
    from torch import nn

    if hf.is_hf_model(model):
        return hf.tensor_widths(model)

    from tpu_tuner.model.workloads.blocks import repeated_blocks

    if not repeated_blocks(model):
        return {
            f"{first}'s width": cast(nn.Linear, model.get_submodule(first)).out_features
            for first, _ in linear_pairs(model)
        }
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
    """The device type of this process group's backend: the registered backend's that joins it
    (gloo runs on CPU tensors)."""
    import torch.distributed as dist

    joined = dist.get_backend()
    # "fake": torch's communication-free group, which a memory estimate shards on (CPU tensors).
    return (
        "cpu"
        if joined in ("gloo", "fake")
        else next(b.kind for b in backend_classes() if b.process_group_backend == joined)
    )


def apply_layout(model: nn.Module, layout: Layout, device_type: str = "cpu", inference: bool = False) -> nn.Module:
    """Shard `model` (in place where the APIs allow; use the returned module) over the default
    process group, which must have `layout.devices` ranks. `inference`: the model only runs
    forwards (no optimizer step), so the data axis holds replicas of rank 0's weights, no DDP."""
    import torch.distributed as dist

    world_size = dist.get_world_size()
    if layout.devices != world_size:
        raise LayoutError(f"layout {layout.short()} needs {layout.devices} ranks, not {world_size}")
    if layout.devices == 1:
        return model
    from_hf = hf.is_hf_model(model)
    if from_hf and layout.tensor > 1 and (reason := hf.why_not_tensor(model, layout.tensor)):
        raise LayoutError(f"layout {layout.short()}: {reason}")  # before a head is split across ranks
    if inference:
        # DDP exists to all-reduce gradients, and a forward alone has none: the replicas need only
        # the same weights, which DDP would have broadcast from rank 0 when wrapping. Nothing in
        # torch tells a replica from an unsharded model, so the mark says how many there are.
        hf.same_weights_as_rank_zero(model)
        setattr(model, REPLICAS_MARK, layout.data)
        if layout.fsdp == 1 and layout.tensor == 1:
            return model
    elif layout.fsdp == 1 and layout.tensor == 1:
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    elif layout.tensor > 1 and layout.data > 1 and layout.fsdp == 1:
        raise LayoutError(
            f"layout {layout.short()}: data x tensor without fsdp runs only as an inference "
            "layout (DDP cannot wrap tensor-parallel parameters): use fsdp"
        )
    names = ("data", "fsdp", "tensor")
    sizes = (layout.data, layout.fsdp, layout.tensor)
    mesh = backend_class(device_type).device_mesh(sizes, names)  # TorchTPU's: ICI-aware rank order
    if from_hf and not inference:  # an inference layout took rank 0's weights above
        hf.same_weights_as_rank_zero(model)
    if layout.tensor > 1:
        if from_hf:
            hf.apply_tensor_plan(model, mesh["tensor"])
        else:
            _tensor_parallel(model, mesh["tensor"], layout.tensor)
    if layout.fsdp > 1:
        from torch.distributed.fsdp import fully_shard

        from tpu_tuner.model.workloads.blocks import repeated_blocks

        dp_mesh = mesh["data", "fsdp"] if layout.data > 1 else mesh["fsdp"]
        for block in hf.shard_blocks(model) if from_hf else repeated_blocks(model):
            fully_shard(block, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
    return model


def batch_shard(layout: Layout, rank: int) -> int:
    """Which of the `layout.batch_shards` slices of the global batch `rank` runs (ranks of one
    tensor-parallel group run the same slice; the mesh is data x fsdp x tensor, row-major)."""
    return rank // layout.tensor


def _tensor_parallel(model: nn.Module, tensor_mesh: DeviceMesh, size: int) -> None:
    from torch import nn
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from tpu_tuner.model.workloads.blocks import repeated_blocks

    blocks = repeated_blocks(model)
    if not blocks:
        pairs = linear_pairs(model)
        styles: dict[str, ParallelStyle] = {
            name: style
            for first, second in pairs
            for name, style in ((first, ColwiseParallel()), (second, RowwiseParallel()))
        }
        parallelize_module(model, tensor_mesh, styles)
        return
    plan = placements(model, _residual_width(model))
    names = {id(module): name for name, module in model.named_modules()}
    for block in blocks:
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


def linear_pairs(model: nn.Module) -> list[tuple[str, str]]:
    """The (column-wise, row-wise) linear pairs of the model's chains of linear layers, by name:
    in every ``Sequential``, a ``Linear`` followed, with only elementwise activations between
    them, by a ``Linear`` that reads its output width. The first splits its output features over
    the tensor axis, the activation runs on each rank's columns, and the second splits its input
    features and sums the ranks' partial outputs (one all-reduce a pair, Megatron's MLP). A
    linear left over (an odd one, or one after a norm) stays whole on every rank."""
    from torch import nn

    pairs: list[tuple[str, str]] = []
    for prefix, sequential in model.named_modules():
        if not isinstance(sequential, nn.Sequential):
            continue
        opened: tuple[str, nn.Linear] | None = None
        for child, module in sequential.named_children():
            name = f"{prefix}.{child}" if prefix else child
            if isinstance(module, nn.Linear):
                if opened is not None and module.in_features == opened[1].out_features:
                    pairs.append((opened[0], name))
                    opened = None
                else:
                    opened = (name, module)
            elif not isinstance(module, _elementwise()):
                opened = None  # a norm or a reshape between two linears needs whole features
    return pairs


def _residual_width(model: nn.Module) -> int:
    """The model's residual width: its token embedding's dimension (the planner's reading), else
    the first Linear's input width."""
    from torch import nn

    embedding = token_embedding(model)
    if embedding is not None:
        return embedding.embedding_dim
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    return linears[0].in_features if linears else 0
