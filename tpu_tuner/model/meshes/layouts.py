"""Sharding layouts: mesh factorisations over data / fsdp / tensor axes, and per-module placements.

A `Layout` names the size of each mesh axis (MaxText's vocabulary: ``data`` replicates
parameters and splits the batch, ``fsdp`` splits both, ``tensor`` splits matmul dimensions
Megatron-style). `placements` derives, from the model's structure alone, how each parameter is
laid out: column-wise linears (their output dimension over ``tensor``), row-wise linears
(input dimension over ``tensor``), embeddings (vocabulary over ``tensor``), with the other
dimension over ``fsdp``; 1-D parameters are replicated. ``context`` (MaxText's context
parallelism; sequence parallelism in other tools' words) splits the sequence of every activation
and, like ``fsdp``, the parameters: attention then gathers keys and values over it.

The whole mesh (docs/planner.md, "The whole mesh"), MaxText's other training axes:
``fsdp_transpose`` splits the batch and the parameters as ``fsdp`` does, but takes the MLP
weights' MLP dimension (MaxText's ``mlp`` rule) where ``fsdp`` takes their ``embed`` one;
``expert`` splits the batch, the dense weights' ``embed`` dimension, and the MoE's stacked expert
weights along their expert dimension (MaxText's ``exp`` rule), so the token dispatch becomes an
all-to-all. Over several slices, ``dcn_data`` and ``dcn_fsdp`` say how many ways of ``data`` and
``fsdp`` run across slices over the data-center network (MaxText's ``dcn_*_parallelism``; the
layout's ``data`` and ``fsdp`` are the whole axes, DCN ways included).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from torch import nn

# The planner's whole mesh, outermost first, in MaxText's order (base.yml's mesh_axes).
MESH_AXES = ("data", "fsdp", "fsdp_transpose", "context", "tensor", "expert")
# Axes a layout names after its DATAxFSDPxTENSOR[xCONTEXT] part, as NAME=SIZE (MaxText's config keys
# without ici_ / _parallelism); the dcn_ ones are the DCN ways of data and fsdp.
NAMED_AXES = ("fsdp_transpose", "expert", "dcn_data", "dcn_fsdp")
# colwise_bias: a column-split linear's bias, split as its output columns are.
Placement = Literal["colwise", "colwise_bias", "rowwise", "embedding", "expert_in", "expert_out", "replicated"]


@dataclass(frozen=True)
class Layout:
    """Sizes of the mesh axes; their product is the number of devices (of every slice together).
    `dcn_data` / `dcn_fsdp`: the ways of `data` / `fsdp` that run across slices (1: none)."""

    data: int
    fsdp: int
    tensor: int
    context: int = 1
    fsdp_transpose: int = 1
    expert: int = 1
    dcn_data: int = 1
    dcn_fsdp: int = 1

    @property
    def devices(self) -> int:
        return self.data * self.fsdp * self.tensor * self.context * self.fsdp_transpose * self.expert

    @property
    def parameter_shards(self) -> int:
        """How many ways each matrix parameter is split (every axis but data)."""
        return self.fsdp * self.context * self.tensor * self.fsdp_transpose * self.expert

    @property
    def batch_shards(self) -> int:
        """How many ways the global batch is split."""
        return self.data * self.fsdp * self.fsdp_transpose * self.expert

    @property
    def slices(self) -> int:
        """How many slices the layout spans (the product of its DCN ways)."""
        return self.dcn_data * self.dcn_fsdp

    def mesh_sizes(self) -> tuple[int, ...]:
        """The size of each of MESH_AXES."""
        return (self.data, self.fsdp, self.fsdp_transpose, self.context, self.tensor, self.expert)

    def dcn_sizes(self) -> tuple[int, ...]:
        """The ways of each of MESH_AXES across slices (MaxText's dcn_parallelism)."""
        return (self.dcn_data, self.dcn_fsdp, 1, 1, 1, 1)

    def ici_sizes(self) -> tuple[int, ...]:
        """The ways of each of MESH_AXES inside one slice (MaxText's ici_parallelism)."""
        return tuple(size // dcn for size, dcn in zip(self.mesh_sizes(), self.dcn_sizes()))

    def _named(self) -> list[tuple[str, int]]:
        return [(axis, getattr(self, axis)) for axis in NAMED_AXES if getattr(self, axis) > 1]

    def name(self) -> str:
        context = f" x context {self.context}" if self.context > 1 else ""
        extra = "".join(f" x {axis} {size}" for axis, size in self._named() if not axis.startswith("dcn_"))
        dcn = ", ".join(f"{axis[4:]} {size}" for axis, size in self._named() if axis.startswith("dcn_"))
        return f"data {self.data} x fsdp {self.fsdp}{context} x tensor {self.tensor}{extra}" + (
            f" (across slices: {dcn})" if dcn else ""
        )

    def short(self, with_context: bool = True) -> str:
        """DATAxFSDPxTENSOR, with xCONTEXT appended when there is one and ,NAME=SIZE for each
        other axis above 1 (the --layout syntax and the layout knob's values): the one spelling of
        a layout, `parse_layout`'s inverse. `with_context` False leaves a context axis out (the
        dashboard's plan table)."""
        context = f"x{self.context}" if with_context and self.context > 1 else ""
        return f"{self.data}x{self.fsdp}x{self.tensor}{context}" + "".join(f",{a}={n}" for a, n in self._named())

    def mesh_shape(self) -> dict[str, int]:
        """Axis -> size, context and the named axes only where there are some (a config's [sharding.mesh])."""
        shape = {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}
        return {**shape, **({"context": self.context} if self.context > 1 else {}), **dict(self._named())}

    @classmethod
    def from_mesh(cls, mesh: Mapping[str, Any]) -> Layout:
        """`mesh_shape`'s inverse (an axis left out has size 1); ValueError / TypeError where a
        size is no integer."""
        return cls(*(int(mesh.get(axis, 1)) for axis in ("data", "fsdp", "tensor", "context", *NAMED_AXES)))

    def without_context(self) -> Layout:
        """The layout on data x fsdp x tensor alone: context, fsdp_transpose and expert folded into
        fsdp, the axis that also splits the parameters and the batch (the layout knob and a torch
        process group have no others); the slices' DCN ways dropped (one process group)."""
        return Layout(self.data, self.fsdp * self.context * self.fsdp_transpose * self.expert, self.tensor)


@dataclass(frozen=True)
class ModelShape:
    """The dimensions that decide which layouts can divide the model."""

    d_model: int
    n_heads: int
    n_kv_heads: int
    mlp_hidden: int
    vocab: int
    n_layers: int


def placements(model: nn.Module, d_model: int) -> dict[str, Placement]:
    """Parameter name -> placement, from the module structure.

    Within each module, a Linear that reads the residual width (in == d_model) is column-wise;
    one that writes it (out == d_model) from another width is row-wise; a square d_model ->
    d_model Linear is row-wise when it is its module's last Linear (an attention output
    projection) and column-wise otherwise (a query projection).
    """
    from torch import nn

    result: dict[str, Placement] = {}
    for module_name, module in model.named_modules():
        linears = [(n, m) for n, m in module.named_children() if isinstance(m, nn.Linear)]
        for index, (child, linear) in enumerate(linears):
            full = f"{module_name}.{child}" if module_name else child
            if child in getattr(module, "column_wise", ()):  # named by its module: latent attention's up-projections
                kind: Placement = "colwise"
            elif linear.in_features == d_model and linear.out_features != d_model:
                kind = "colwise"
            elif linear.out_features == d_model and linear.in_features != d_model:
                kind = "rowwise"
            elif linear.in_features == d_model:
                kind = "rowwise" if index == len(linears) - 1 and len(linears) > 1 else "colwise"
            else:
                kind = "replicated"
            result[f"{full}.weight"] = kind
            if linear.bias is not None:
                result[f"{full}.bias"] = "colwise_bias" if kind == "colwise" else "replicated"
        for child, embedding in module.named_children():
            if isinstance(embedding, nn.Embedding):
                full = f"{module_name}.{child}" if module_name else child
                result[f"{full}.weight"] = "embedding"
    for name, parameter in model.named_parameters():
        if parameter.dim() == 3 and name not in result:
            # Stacked expert weights [experts, in, out]: the d_model side over fsdp and the MLP side
            # over tensor, as MaxText's embed_no_exp / mlp axes place them.
            if parameter.shape[1] == d_model:
                result[name] = "expert_in"
            elif parameter.shape[2] == d_model:
                result[name] = "expert_out"
        result.setdefault(name, "replicated")
    return result


def partition_spec(placement: str, ndim: int) -> tuple:
    """The PartitionSpec entries (mesh axis per dimension) of a parameter placement.

    torch Linear weights are (out, in): column-wise splits `out` over tensor and `in` over
    fsdp; row-wise the reverse. Embeddings are (vocab, d): vocab over tensor, d over fsdp.
    """
    if ndim < 2:
        return ("tensor",) if placement == "colwise_bias" else ()
    if placement == "expert_in":
        return (None, "fsdp", "tensor")
    if placement == "expert_out":
        return (None, "tensor", "fsdp")
    if placement in ("colwise", "embedding"):
        return ("tensor", "fsdp")
    if placement == "rowwise":
        return ("fsdp", "tensor")
    return ()


# MaxText's logical axis rules (base.yml) as mesh axes: a weight's embed side, the MLP side of the
# MLP's weights (fsdp_transpose there, so their embed side leaves it out), the expert dimension.
_EMBED = ("fsdp", "fsdp_transpose", "context", "expert")
_MLP_EMBED = ("fsdp", "context", "expert")
_MLP = ("fsdp_transpose", "tensor")
_MOE_EMBED = ("fsdp", "context")


def mesh_partition_spec(placement: str, ndim: int, mlp: bool = False) -> tuple:
    """The PartitionSpec entries over MESH_AXES of an `ndim`-dimensional parameter placed as
    `placement`: `partition_spec`'s axes resolved as MaxText's rules resolve them (an axis of size
    1 splits nothing, so a layout without the named axes compiles as before). `mlp`: a weight (or
    bias) of the MLP's linears, whose MLP side goes over fsdp_transpose x tensor (MaxText's ``mlp``
    rule) and embed side over the rest."""
    if ndim < 2:
        if placement != "colwise_bias":
            return ()
        return (_MLP,) if mlp else ("tensor",)
    if placement == "expert_in":
        return ("expert", _MOE_EMBED, _MLP)
    if placement == "expert_out":
        return ("expert", _MLP, _MOE_EMBED)
    if placement in ("colwise", "embedding"):  # (out, in): out over tensor
        return (_MLP, _MLP_EMBED) if mlp and placement == "colwise" else ("tensor", _EMBED)
    if placement == "rowwise":  # (out, in): in over tensor
        return (_MLP_EMBED, _MLP) if mlp else (_EMBED, "tensor")
    return ()


def enumerate_layouts(
    devices: int,
    shape: ModelShape,
    global_batch: int,
    seq_len: int | None = None,
    slices: int = 1,
) -> tuple[list[Layout], list[tuple[Layout, str]]]:
    """All data x fsdp x tensor factorisations of `devices`, split into valid and rejected (why).
    Over `slices` slices, each factorisation once per way of spreading the slices over data and
    fsdp that divides them (data first: MaxText's default)."""
    valid: list[Layout] = []
    rejected: list[tuple[Layout, str]] = []
    for tensor in divisors(devices):
        for fsdp in divisors(devices // tensor):
            data = devices // tensor // fsdp
            for dcn_data in sorted(divisors(slices), reverse=True):
                dcn_fsdp = slices // dcn_data
                if data % dcn_data or fsdp % dcn_fsdp:
                    continue
                layout = Layout(data, fsdp, tensor, dcn_data=dcn_data, dcn_fsdp=dcn_fsdp)
                reason = why_not(layout, shape, global_batch, seq_len)
                (rejected.append((layout, reason)) if reason else valid.append(layout))
    return valid, rejected


def with_expert_axes(layouts: list[Layout], experts: int) -> list[Layout]:
    """Each layout again with part of its fsdp axis made an expert axis, of every size above 1 that
    divides `experts` and the fsdp axis (MaxText's ici_expert_parallelism): a mixture of experts'
    layer then gathers a 1/expert share of its weights, which an all-FSDP layout of a large MoE
    cannot fit (a 700B MoE on v6e-256: its published run is fsdp 16 x expert 16)."""
    found = []
    for layout in layouts:
        if layout.expert > 1:
            continue
        for size in divisors(experts):
            fsdp = layout.fsdp // size
            if size > 1 and layout.fsdp % size == 0 and fsdp % layout.dcn_fsdp == 0:
                found.append(replace(layout, fsdp=fsdp, expert=size))
    return found


def parse_layout(text: str, context: bool = True) -> Layout:
    """DATAxFSDPxTENSOR[xCONTEXT][,NAME=SIZE...], e.g. 1x64x4, 1x32x4x2 or 2x32x1,dcn_data=2 (NAME one
    of NAMED_AXES); `context` False: the three axes alone (the layout knob's values). ValueError
    saying the syntax, or naming the unknown axis, when it is not one."""
    positional, *named = text.lower().split(",") if isinstance(text, str) else [""]
    try:
        sizes = [int(part) for part in positional.split("x")]
    except ValueError:
        sizes = []
    if not context:
        if len(sizes) != 3 or named:
            raise ValueError(f"layout must be DATAxFSDPxTENSOR (e.g. 1x2x1), not {text!r}")
        if min(sizes) < 1:
            raise ValueError(f"layout {text!r}: every axis must be at least 1")
        return Layout(*sizes)
    if len(sizes) not in (3, 4) or min(sizes) < 1:
        raise ValueError(f"{text!r} is not DATAxFSDPxTENSOR[xCONTEXT][,NAME=SIZE...] with sizes of at least 1")
    extra: dict[str, int] = {}
    for part in named:
        axis, _, size = part.partition("=")
        axis = axis.strip()
        if axis == "dcn_pipeline":
            raise ValueError(
                f"layout {text!r}: dcn_pipeline (pipeline stages across slices) is not compiled "
                "by the planner; put the slices on dcn_data or dcn_fsdp"
            )
        if axis not in NAMED_AXES:
            raise ValueError(f"layout {text!r}: unknown axis {axis!r} (known: {', '.join(NAMED_AXES)})")
        if not size.strip().isdigit() or int(size) < 1 or axis in extra:
            raise ValueError(f"layout {text!r}: {axis} takes one size of at least 1, as {axis}=2")
        extra[axis] = int(size)
    layout = Layout(*sizes, **extra)
    for axis in ("data", "fsdp"):
        if getattr(layout, axis) % getattr(layout, f"dcn_{axis}"):
            raise ValueError(
                f"layout {text!r}: dcn_{axis} {getattr(layout, f'dcn_{axis}')} does not divide "
                f"{axis} {getattr(layout, axis)} (the whole axis, its DCN ways included)"
            )
    return layout


def why_not(layout: Layout, shape: ModelShape, global_batch: int, seq_len: int | None = None) -> str | None:
    """Why `layout` cannot split this model and batch (None: it can)."""
    if layout.context > 1 and (seq_len is None or seq_len % layout.context):
        return f"context {layout.context} does not divide the sequence length {seq_len}"
    if global_batch % layout.batch_shards:
        return f"global batch {global_batch} does not divide over data x fsdp = {layout.batch_shards}"
    if shape.n_heads % layout.tensor or shape.n_kv_heads % layout.tensor:
        return f"tensor {layout.tensor} does not divide {shape.n_heads} heads / {shape.n_kv_heads} KV heads"
    if shape.mlp_hidden % layout.tensor or shape.vocab % layout.tensor:
        return f"tensor {layout.tensor} does not divide the MLP width {shape.mlp_hidden} or vocabulary {shape.vocab}"
    embed = layout.fsdp * layout.context * layout.fsdp_transpose * layout.expert
    if shape.d_model % embed:
        names = "fsdp x context" + " x fsdp_transpose" * (layout.fsdp_transpose > 1) + " x expert" * (layout.expert > 1)
        return f"{names} {embed} does not divide d_model {shape.d_model}"
    if shape.mlp_hidden % (layout.fsdp_transpose * layout.tensor):
        return (
            f"fsdp_transpose x tensor {layout.fsdp_transpose * layout.tensor} does not divide the MLP width "
            f"{shape.mlp_hidden}"
        )
    return None


def divisors(n: int) -> list[int]:
    """The divisors of `n`, smallest first."""
    return [d for d in range(1, n + 1) if n % d == 0]


def why_not_ranks(
    layout: Layout,
    world_size: int,
    batch_size: int | None,
    repeated_blocks: int,
    widths: Mapping[str, int],
    inference: bool = False,
) -> str | None:
    """Why `layout` cannot run as `world_size` ranks of a torch step (`parallel/apply.py`: DDP,
    FSDP2 on repeated blocks, DTensor tensor parallelism) with a global batch of `batch_size`,
    from the model's numbers: its count of repeated blocks and the widths a tensor axis must
    divide (name -> width, empty where no linear layer splits); None where it can. `inference`:
    the step is a forward alone, whose data axis is plain replicas (no DDP), so data x tensor can
    run. `why_not` is the planner's question (a model shape on a TPU mesh)."""
    if layout.devices != world_size:
        return f"layout {layout.short()} needs {layout.devices} ranks, not {world_size}"
    if batch_size is not None and batch_size % layout.batch_shards:
        return f"the batch of {batch_size} does not divide over data x fsdp = {layout.batch_shards}"
    if layout.tensor > 1 and layout.data > 1 and layout.fsdp == 1 and not inference:
        return "data x tensor without fsdp is not supported (DDP cannot wrap tensor-parallel parameters): use fsdp"
    if layout.fsdp > 1 and repeated_blocks < 2:
        return "fsdp layouts shard repeated blocks, and the model has fewer than two like blocks"
    if layout.tensor > 1:
        if not widths:
            return (
                "tensor parallelism finds no column- or row-wise linear layer (in the repeated blocks, or "
                "pairs of a chain of linear layers)"
            )
        for name, width in widths.items():
            if width % layout.tensor:
                return f"tensor {layout.tensor} does not divide {name} = {width}"
    return None
