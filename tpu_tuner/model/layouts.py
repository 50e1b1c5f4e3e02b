"""Sharding layouts: mesh factorisations over data / fsdp / tensor axes, and per-module placements.

A `Layout` names the size of each mesh axis (MaxText's vocabulary: ``data`` replicates
parameters and splits the batch, ``fsdp`` splits both, ``tensor`` splits matmul dimensions
Megatron-style). `placements` derives, from the model's structure alone, how each parameter is
laid out: column-wise linears (their output dimension over ``tensor``), row-wise linears
(input dimension over ``tensor``), embeddings (vocabulary over ``tensor``), with the other
dimension over ``fsdp``; 1-D parameters are replicated. ``context`` (MaxText's context
parallelism; sequence parallelism in other tools' words) splits the sequence of every activation
and, like ``fsdp``, the parameters: attention then gathers keys and values over it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from torch import nn

AXES = ("data", "fsdp", "context", "tensor")  # the mesh's axes, outermost first
Placement = Literal["colwise", "rowwise", "embedding", "expert_in", "expert_out", "replicated"]


@dataclass(frozen=True)
class Layout:
    """Sizes of the mesh axes; their product is the number of devices."""

    data: int
    fsdp: int
    tensor: int
    context: int = 1

    @property
    def devices(self) -> int:
        return self.data * self.fsdp * self.tensor * self.context

    @property
    def parameter_shards(self) -> int:
        """How many ways each matrix parameter is split (fsdp x context x tensor)."""
        return self.fsdp * self.context * self.tensor

    @property
    def batch_shards(self) -> int:
        """How many ways the global batch is split."""
        return self.data * self.fsdp

    def name(self) -> str:
        context = f" x context {self.context}" if self.context > 1 else ""
        return f"data {self.data} x fsdp {self.fsdp}{context} x tensor {self.tensor}"

    def short(self) -> str:
        """DATAxFSDPxTENSOR, with xCONTEXT appended when there is one (the --layout syntax)."""
        return f"{self.data}x{self.fsdp}x{self.tensor}" + (f"x{self.context}" if self.context > 1 else "")

    def mesh_shape(self) -> dict[str, int]:
        shape = {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}
        return {**shape, "context": self.context} if self.context > 1 else shape


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
            if linear.in_features == d_model and linear.out_features != d_model:
                kind: Placement = "colwise"
            elif linear.out_features == d_model and linear.in_features != d_model:
                kind = "rowwise"
            elif linear.in_features == d_model:
                kind = "rowwise" if index == len(linears) - 1 and len(linears) > 1 else "colwise"
            else:
                kind = "replicated"
            result[f"{full}.weight"] = kind
            if linear.bias is not None:
                result[f"{full}.bias"] = "colwise_bias" if kind == "colwise" else "replicated"  # type: ignore[assignment]
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


def enumerate_layouts(devices: int, shape: ModelShape, global_batch: int, seq_len: int | None = None,
                      contexts: tuple[int, ...] = (1,)) -> tuple[list[Layout], list[tuple[Layout, str]]]:
    """All data x fsdp x tensor (x context, for each of `contexts`) factorisations of `devices`,
    split into valid and rejected (why)."""
    valid: list[Layout] = []
    rejected: list[tuple[Layout, str]] = []
    for context in (c for c in contexts if devices % c == 0):
        for tensor in _divisors(devices // context):
            for fsdp in _divisors(devices // context // tensor):
                layout = Layout(devices // context // tensor // fsdp, fsdp, tensor, context)
                reason = why_not(layout, shape, global_batch, seq_len)
                (rejected.append((layout, reason)) if reason else valid.append(layout))
    return valid, rejected


def parse_layout_text(text: str) -> Layout:
    """DATAxFSDPxTENSOR[xCONTEXT], e.g. 1x64x4 or 1x32x4x2 (ValueError when it is not)."""
    sizes = [int(x) for x in text.lower().split("x")]
    if len(sizes) not in (3, 4) or min(sizes) < 1:
        raise ValueError(f"{text!r} is not DATAxFSDPxTENSOR[xCONTEXT] with sizes of at least 1")
    return Layout(*sizes)


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
    if shape.d_model % (layout.fsdp * layout.context):
        return f"fsdp x context {layout.fsdp * layout.context} does not divide d_model {shape.d_model}"
    return None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def parse_data_fsdp_tensor(value: str) -> tuple[int, int, int]:
    """``"DxFxT"`` as (data, fsdp, tensor); ValueError naming the knob when malformed."""
    try:
        data, fsdp, tensor = (int(part) for part in value.lower().split("x"))
    except (ValueError, AttributeError):
        raise ValueError(f"layout must be DATAxFSDPxTENSOR (e.g. 1x2x1), not {value!r}") from None
    if min(data, fsdp, tensor) < 1:
        raise ValueError(f"layout {value!r}: every axis must be at least 1")
    return data, fsdp, tensor
