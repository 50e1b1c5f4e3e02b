"""The dropless MoE's grouped matmuls and row permutations (``tpu_tune::grouped_matmul``,
``tpu_tune::permute_rows``, model/decoders/experts.py) as the planner compiles them. The matmuls: per
device, under `shard_map`, as MaxText's ``sparse_matmul`` runs its experts
(layers/moe.py at e591f30: the routed computation inside ``jax.shard_map``, the batch over the
data-parallel axes, expert weights gathered over fsdp and split over tensor on the MLP width, the
down projection's partial sums reduce-scattered over tensor). Each device sorts its own sequences'
rows once (`sort_each_device`: one sort group a device) and runs one grouped matmul over them, as
MaxText's ``permute`` sorts a device's tokens inside that shard_map; each output carries the
checkpoint name the model gives it (``mlpwi_0``, ``mlpwi_1``, ``mlpwo``), as MaxText names them there.

On a TPU the kernel is JAX's megablox grouped matmul (``jax.experimental.pallas.ops.tpu.megablox``,
``gmm`` forward and ``tgmm`` for the weights' gradient), as MaxText's defaults (``megablox: true``,
``sparse_matmul: true``) run it: its cost estimate counts each row against its own expert
(2 m k n). ``jax.lax.ragged_dot`` compiles to the same kernel forward, but libtpu 0.0.42 expands
its weight gradient (a ragged contraction) into every expert's dense product, experts x the work
(docs/planner.md, "Mixtures of experts as run"). Elsewhere (the emulated-CPU cross-check) it is
``jax.lax.ragged_dot``. The permutations are gathers whose gradient gathers with the inverse
permutation, as MaxText's ``use_custom_sort_vjp`` (default true) has it: a gather's own gradient is a
scatter-add, which the TPU compiler sorts. JAX and torchax are imported inside the function (the
`plan` extra).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from tpu_tuner.model.decoders.experts import MixtureOfExperts  # registers torch.ops.tpu_tune.grouped_matmul
from tpu_tuner.planner.compiler.mesh import BATCH_AXES

# MaxText's megablox tiles for the batch x sequence, embed and MLP dimensions (wi_tile_fwd_* in
# configs/base.yml at e591f30), cut to the operands' sizes.
TILING = (512, 1024, 1024)


def kernel_tile(size: int, preferred: int) -> int:
    """A megablox tile for a dimension of `size`: the largest multiple of 128 up to `preferred` that
    divides it; else the whole dimension where it is no wider than `preferred` (the kernel takes a
    block equal to the array's), or `preferred` itself, the last tile partial (gmm and tgmm mask an
    irregular last tile of the embed and MLP dimensions; MaxText passes its 1024-wide tiles to
    megablox uncut). gpt-oss's 2880 has no 128-multiple divisor: whole, its 2880 x 2880 weight
    block (16.6 MB, double-buffered) overflows the 32 MiB of scoped VMEM the compiler allows."""
    for tile in range(min(preferred, size) // 128 * 128, 0, -128):
        if size % tile == 0:
            return tile
    return size if size <= preferred else preferred


def sort_each_device(model: nn.Module, mesh: Any, batch: int) -> None:
    """Sort each device's dropless rows once: every MixtureOfExperts of `model` gets the sequences a
    device holds of a `batch` of sequences as its sort group, where they divide evenly and no
    context axis splits the sequences (else one sequence a group, each device's several)."""
    ways = math.prod(dict(mesh.shape).get(axis, 1) for axis in BATCH_AXES)
    whole = batch % ways == 0 and dict(mesh.shape).get("context", 1) == 1
    for module in model.modules():
        if isinstance(module, MixtureOfExperts):
            module.sort_group = batch // ways if whole else 1


def _megablox(rows: Any, weights: Any, sizes: Any) -> Any:
    """megablox's grouped matmul of each sort group's rows (`rows` [sort groups, rows, k], `sizes`
    [sort groups, experts]; one group a device where `sort_each_device` set it) with a tiling for
    each pass, as MaxText sets its wi/wo tiles for the forward pass and both backward ones: the
    kernel's own gradient reuses the forward's tiling for the transposed product, which no tile
    suits where the two widths are not multiples of a common one (Gemma 4 26B: 2816 x 704).
    Where a device holds several groups the weights' gradient is one buffer that each group's tgmm
    adds into (its ``existing_out``)."""
    import importlib

    import jax
    import jax.numpy as jnp

    # The kernels' module: the package's `gmm` name is the function with the shared-tiling gradient.
    kernels = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")

    groups, rows_tile = rows.shape[0], min(TILING[0], rows.shape[1])
    embed, width = kernel_tile(rows.shape[2], TILING[1]), kernel_tile(weights.shape[2], TILING[2])

    @jax.custom_vjp
    def grouped(lhs: Any, rhs: Any, group_sizes: Any) -> Any:
        return jnp.stack(
            [kernels.gmm(lhs[i], rhs, group_sizes[i], lhs.dtype, (rows_tile, embed, width)) for i in range(groups)]
        )

    def forward(lhs: Any, rhs: Any, group_sizes: Any) -> tuple[Any, tuple[Any, Any, Any]]:
        return grouped(lhs, rhs, group_sizes), (lhs, rhs, group_sizes)

    def backward(saved: tuple[Any, Any, Any], grad: Any) -> tuple[Any, Any, None]:
        lhs, rhs, group_sizes = saved
        d_lhs = jnp.stack(
            [
                kernels.gmm(grad[i], rhs, group_sizes[i], lhs.dtype, (rows_tile, width, embed), transpose_rhs=True)
                for i in range(groups)
            ]
        )
        d_rhs = None
        for i in range(groups):
            d_rhs = kernels.tgmm(
                lhs[i].swapaxes(0, 1), grad[i], group_sizes[i], rhs.dtype, (rows_tile, embed, width), existing_out=d_rhs
            )
        return d_lhs, d_rhs, None

    grouped.defvjp(forward, backward)
    return grouped(rows, weights, sizes)


def grouped_matmuls_per_device(env: Any, mesh: Any, megablox: bool) -> None:
    """Compile every ``tpu_tune::grouped_matmul`` per device on `mesh` (the rows over its batch axes,
    the weights over tensor, every expert gathered): megablox's kernel when `megablox` (a TPU), else
    ``jax.lax.ragged_dot``; and every ``tpu_tune::permute_rows`` as a gather with a gathering gradient."""
    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name
    from jax.sharding import PartitionSpec
    from torchax.interop import jax_view, torch_view

    # The rows split over every axis that splits the batch (sort_each_device's groups): an expert or
    # fsdp_transpose axis left out would hold every row on each of its devices, and compute it there.
    batch = tuple(axis for axis in BATCH_AXES if axis in mesh.shape)
    tensor = mesh.shape["tensor"]

    def kernel(rows: Any, weights: Any, sizes: Any) -> Any:  # rows [sort groups, rows, k], sizes [sort groups, experts]
        if not megablox:
            return jnp.stack([jax.lax.ragged_dot(rows[i], weights, sizes[i]) for i in range(rows.shape[0])])
        return _megablox(rows, weights, sizes)

    def matmul(
        x: torch.Tensor, weights: torch.Tensor, group_sizes: torch.Tensor, rowwise: bool, role: str = ""
    ) -> torch.Tensor:
        x_j, w_j, sizes_j = jax_view(x), jax_view(weights), jax_view(group_sizes).astype(jnp.int32)
        # Down projections contract the tensor-split MLP width: partial sums, reduce-scattered over
        # tensor on d_model where it divides (MaxText's psum_scatter), else summed.
        scatter = rowwise and tensor > 1 and w_j.shape[2] % tensor == 0
        out_spec = PartitionSpec(batch, None, "tensor" if scatter or not rowwise else None)

        def local(x: Any, w: Any, sizes: Any) -> Any:
            # One grouped matmul per sort group this device holds (one where sort_each_device set it).
            y = kernel(x, w, sizes)
            if rowwise and tensor > 1:
                y = (
                    jax.lax.psum_scatter(y, "tensor", scatter_dimension=2, tiled=True)
                    if scatter
                    else jax.lax.psum(y, "tensor")
                )
            return checkpoint_name(y, role) if role else y

        specs = (
            (PartitionSpec(batch, None, "tensor"), PartitionSpec(None, "tensor", None))
            if rowwise
            else (PartitionSpec(batch, None, None), PartitionSpec(None, None, "tensor"))
        )
        sharded = jax.shard_map(
            local, mesh=mesh, in_specs=(*specs, PartitionSpec(batch, None)), out_specs=out_spec, check_vma=False
        )
        return torch_view(sharded(x_j, w_j, sizes_j))

    @jax.custom_vjp
    def permute(x: Any, index: Any) -> Any:
        return jnp.take_along_axis(x, index[..., None], axis=1)

    def permute_forward(x: Any, index: Any) -> tuple[Any, Any]:
        return permute(x, index), index

    def permute_backward(index: Any, grad: Any) -> tuple[Any, None]:
        # The inverse permutation, gathered: MaxText's _sort_activations custom VJP (layers/moe.py).
        return permute(grad, jnp.argsort(index, axis=-1)), None

    permute.defvjp(permute_forward, permute_backward)

    def permute_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return torch_view(permute(jax_view(x), jax_view(index)))

    env.override_op_definition(torch.ops.tpu_tune.grouped_matmul.default, matmul)
    env.override_op_definition(torch.ops.tpu_tune.permute_rows.default, permute_rows)


__all__ = ["TILING", "grouped_matmuls_per_device", "kernel_tile", "sort_each_device"]
