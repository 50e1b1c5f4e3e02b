"""Sharding layouts: mesh factorisations over data / fsdp / tensor axes, and per-module placements.

A `Layout` names the size of each mesh axis (MaxText's vocabulary: ``data`` replicates
parameters and splits the batch, ``fsdp`` splits both, ``tensor`` splits matmul dimensions
Megatron-style). `placements` derives, from the model's structure alone, how each parameter is
laid out: column-wise linears (their output dimension over ``tensor``), row-wise linears
(input dimension over ``tensor``), embeddings (vocabulary over ``tensor``), with the other
dimension over ``fsdp``; 1-D parameters are replicated. Sequence and expert axes have a place
in `AXES` but no layout uses them yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import nn

AXES = ("data", "fsdp", "tensor")  # room for "sequence" and "expert" later
Placement = Literal["colwise", "rowwise", "embedding", "replicated"]


@dataclass(frozen=True)
class Layout:
    """Sizes of the mesh axes; their product is the number of devices."""

    data: int
    fsdp: int
    tensor: int

    @property
    def devices(self) -> int:
        return self.data * self.fsdp * self.tensor

    @property
    def batch_shards(self) -> int:
        """How many ways the global batch is split."""
        return self.data * self.fsdp

    def name(self) -> str:
        return f"data {self.data} x fsdp {self.fsdp} x tensor {self.tensor}"

    def mesh_shape(self) -> dict[str, int]:
        return {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}


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
        result.setdefault(name, "replicated")
    return result


def partition_spec(placement: str, ndim: int) -> tuple:
    """The PartitionSpec entries (mesh axis per dimension) of a parameter placement.

    torch Linear weights are (out, in): column-wise splits `out` over tensor and `in` over
    fsdp; row-wise the reverse. Embeddings are (vocab, d): vocab over tensor, d over fsdp.
    """
    if ndim < 2:
        return ("tensor",) if placement == "colwise_bias" else ()
    if placement in ("colwise", "embedding"):
        return ("tensor", "fsdp")
    if placement == "rowwise":
        return ("fsdp", "tensor")
    return ()


def enumerate_layouts(devices: int, shape: ModelShape, global_batch: int) -> tuple[list[Layout], list[tuple[Layout, str]]]:
    """All data x fsdp x tensor factorisations of `devices`, split into valid and rejected (why)."""
    valid: list[Layout] = []
    rejected: list[tuple[Layout, str]] = []
    for tensor in _divisors(devices):
        for fsdp in _divisors(devices // tensor):
            layout = Layout(devices // tensor // fsdp, fsdp, tensor)
            reason = _why_not(layout, shape, global_batch)
            (rejected.append((layout, reason)) if reason else valid.append(layout))
    return valid, rejected


def _why_not(layout: Layout, shape: ModelShape, global_batch: int) -> str | None:
    if global_batch % layout.batch_shards:
        return f"global batch {global_batch} does not divide over data x fsdp = {layout.batch_shards}"
    if shape.n_heads % layout.tensor or shape.n_kv_heads % layout.tensor:
        return f"tensor {layout.tensor} does not divide {shape.n_heads} heads / {shape.n_kv_heads} KV heads"
    if shape.mlp_hidden % layout.tensor or shape.vocab % layout.tensor:
        return f"tensor {layout.tensor} does not divide the MLP width {shape.mlp_hidden} or vocabulary {shape.vocab}"
    if shape.d_model % layout.fsdp:
        return f"fsdp {layout.fsdp} does not divide d_model {shape.d_model}"
    return None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
