"""What `program.compile_step` puts into the traced model besides torchax's own translation: MaxText's
checkpoint names on the block tensors, the scanned blocks' stand-in, and the embedding and attention
the planner compiles in place of torchax's. JAX and torchax are imported inside each function (the
`plan` extra).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tpu_tuner.model.decoders.attention import local_attention_op
from tpu_tuner.planner.compiler.remat import block_tensor_roles


def name_block_tensors(blocks: list[nn.Module], d_model: int, mlp_hidden: int) -> None:
    """Give the block tensors MaxText's checkpoint names (remat.block_tensor_roles), so that a
    policy can save or offload them: each projection's output, the out projection's input
    (``context``). Hooks on every block (unrolled), the one template the scan calls, and the
    blocks beside the scan (each read for its own structure)."""
    from jax.ad_checkpoint import checkpoint_name
    from torchax.interop import jax_view, torch_view

    def named(name: str) -> Callable[..., Any]:
        def hook(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
            return torch_view(checkpoint_name(jax_view(output), name))

        return hook

    def named_context(module: nn.Module, args: tuple) -> tuple:
        return (torch_view(checkpoint_name(jax_view(args[0]), "context")), *args[1:])

    for block in blocks:
        roles, context_of = block_tensor_roles(block, d_model, mlp_hidden)
        for path, role in roles.items():
            block.get_submodule(path).register_forward_hook(named(role))
        for path in context_of:
            block.get_submodule(path).register_forward_pre_hook(named_context)


class ScannedBlocks(nn.Module):
    """Stands in for a ModuleList's blocks: the model's loop calls it once and it scans them all.

    Holds no weights of its own: the stacked ones arrive as the step's arguments."""

    def __init__(self, run: Callable[[torch.Tensor, tuple, dict], torch.Tensor]) -> None:
        super().__init__()
        self.run = run

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.run(x, args, kwargs)


def embedding_without_index_sort(env: Any) -> None:
    """Compile embedding lookups with a gradient that scatters without sorting the token ids.

    JAX's gradient of a gather is a scatter-add, which the TPU compiler lowers by sorting the
    (token, update row) pairs; at a 70B model's size that sort is most of a compile's time
    (docs/planner.md, "Compiler shortcuts"). The planner never runs the program, so it tells the
    compiler the ids are sorted; the sort it leaves out is of a few thousand keys per step, while
    the scatter's FLOPs and bytes are unchanged.
    """
    import jax
    import jax.numpy as jnp
    import torch.nn.functional as F
    from torchax.interop import jax_view, torch_view

    def embedding(input, weight, padding_idx=None, max_norm=None, *args, **kwargs):
        if max_norm is not None:
            raise NotImplementedError("the planner's embedding takes no max_norm")
        table, ids = jax_view(weight), jax_view(input)
        shape, dtype = table.shape, table.dtype

        @jax.custom_vjp
        def lookup(table: Any, ids: Any) -> Any:
            return jnp.take(table, ids, axis=0)

        def forward(table: Any, ids: Any) -> tuple[Any, Any]:
            return lookup(table, ids), ids

        def backward(ids: Any, grad: Any) -> tuple[Any, None]:
            rows = grad.reshape(-1, shape[-1])
            table_grad = jnp.zeros(shape, grad.dtype).at[ids.reshape(-1)].add(rows, indices_are_sorted=True)
            return table_grad.astype(dtype), None

        lookup.defvjp(forward, backward)
        return torch_view(lookup(table, ids))

    env.override_op_definition(F.embedding, embedding)


def sharded_attention(env: Any, mesh: Any, flash: bool, flash_block: int | None = None) -> None:
    """Run F.scaled_dot_product_attention per device: heads over the tensor axis, the batch over
    (data, fsdp), inside `shard_map`; with `flash` as TPU flash attention (Pallas), as MaxText does,
    in the kernel's default 128 blocks or `flash_block` ones (the calibration's programs use the
    default; at 512, MaxText's splash blocks, causal attention ran 3.7x faster on a v5e chip:
    docs/planner.md, "On a real chip").

    torchax's own translation materialises the [batch, heads, seq, seq] scores, which at 8k
    tokens outweighs everything else in HBM; on a TPU the attention is a flash kernel that never
    does. Elsewhere (the emulated-CPU cross-check) it is the textbook attention under the same
    shard_map (plain softmax attention), so both compilers are given the same per-device split
    (left to XLA's own partitioning, the CPU compile counts more FLOPs per block for
    tensor-parallel layouts: docs/planner.md, "Prediction").
    """
    import jax
    import jax.numpy as jnp
    import torch.nn.functional as F
    from jax.experimental.pallas.ops.tpu import flash_attention as pallas_flash
    from torchax.interop import jax_view, torch_view

    spec = _heads_spec(mesh)
    context = mesh.shape["context"]

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is not None or dropout_p or query.shape[1] % key.shape[1]:
            raise NotImplementedError(
                "the planner's flash attention takes causal or full attention, no mask, and "
                "query heads a multiple of the key/value heads"
            )
        q, k, v = (jax_view(t) for t in (query, key, value))
        if k.shape[1] != q.shape[1]:
            # Grouped-query attention (enable_gqa, as transformers' sdpa passes it): each K/V head
            # serves a group of query heads, repeated here as the generic decoder repeats them.
            k, v = (jnp.repeat(t, q.shape[1] // k.shape[1], axis=1) for t in (k, v))
        sm_scale = scale if scale is not None else q.shape[-1] ** -0.5
        # Context parallel: each device holds a slice of the queries and gathers every key and
        # value over the context axis (MaxText's all-gather context parallelism). The kernel
        # takes no query offset, so the slice attends to every key unmasked: the same cost to the
        # compiler (the kernel's cost estimate does not discount a causal mask), not the same
        # numbers, which the planner never computes.
        causal = bool(is_causal) and context == 1
        if flash:

            def kernel(q: Any, k: Any, v: Any) -> Any:
                # JAX's flash kernel takes one head width, up to 128 or a multiple of 128: latent
                # attention's (192-wide keys, 128-wide values) are padded with zero columns, which
                # change no score and no output column, and the output is cut back.
                width, head = v.shape[-1], max(q.shape[-1], v.shape[-1])
                head = head if head <= 128 else -(-head // 128) * 128
                q, k, v = (
                    t if t.shape[-1] == head else jnp.pad(t, ((0, 0),) * 3 + ((0, head - t.shape[-1]),))
                    for t in (q, k, v)
                )
                return pallas_flash.flash_attention(
                    q,
                    k,
                    v,
                    causal=causal,
                    sm_scale=sm_scale,
                    block_sizes=_flash_blocks(pallas_flash, flash_block, q, k),
                )[..., :width]
        else:

            def kernel(q: Any, k: Any, v: Any) -> Any:  # softmax(q k^T) v, [batch, heads, seq, head_dim]
                scores = jnp.einsum("bhqd,bhkd->bhqk", q, k).astype(jnp.float32) * sm_scale
                if causal:
                    scores = jnp.where(jnp.tril(jnp.ones(scores.shape[-2:], bool)), scores, -jnp.inf)
                return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1).astype(q.dtype), v)

        def attend(q: Any, k: Any, v: Any) -> Any:
            if context > 1:
                k, v = (jax.lax.all_gather(t, "context", axis=2, tiled=True) for t in (k, v))
            return kernel(q, k, v)

        sharded = jax.shard_map(attend, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)
        return torch_view(sharded(q, k, v))

    env.override_op_definition(F.scaled_dot_product_attention, sdpa)
    env.override_op_definition(local_attention_op(), _local_attention(mesh, flash))


def _flash_blocks(pallas_flash: Any, block: int | None, q: Any, k: Any) -> Any:
    """`block`-sized blocks where both sequences divide into them, else (and for None) the kernel's default."""
    if block is None or q.shape[2] % block or k.shape[2] % block:
        return None
    return pallas_flash.BlockSizes(*(block,) * 3, 1, *(block,) * 7)


def _heads_spec(mesh: Any) -> Any:
    """[batch, heads, seq, head_dim] per device: the batch over every axis that splits it
    (fsdp_transpose and expert too: planner/compiler/mesh.py), heads over tensor, the sequence over context."""
    from jax.sharding import PartitionSpec

    return PartitionSpec(
        tuple(a for a in ("data", "fsdp", "fsdp_transpose", "expert") if a in mesh.shape), "tensor", "context", None
    )


def _local_attention(mesh: Any, splash: bool) -> Callable[..., Any]:
    """The package's local attention operator (model/decoders/attention.py: a sliding window or chunks,
    optional sinks) per device under `shard_map`, split as `sharded_attention` splits global
    attention; with `splash` as Pallas splash attention with its block-sparse mask
    (`LocalMask` / `ChunkedCausalMask`, as MaxText runs local layers), which visits only the
    blocks the mask keeps. Elsewhere (the emulated-CPU cross-check) the masked textbook attention.

    Under context parallelism each device's queries meet every gathered key through the mask of
    the first query slice (the mask is static; the kernel takes no per-device offset): the same
    number of visited blocks for a window away from the sequence's start, not the same numbers."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernels
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks
    from jax.sharding import PartitionSpec
    from torchax.interop import jax_view, torch_view

    spec = _heads_spec(mesh)
    context = mesh.shape["context"]

    def mask_of(queries: int, keys: int, window: int, chunk: int) -> Any:
        shape = (queries, keys)
        if window:
            return masks.LocalMask(shape, window_size=(window - 1, 0), offset=0)
        if chunk:
            return masks.ChunkedCausalMask(shape, chunk_size=chunk)
        return masks.CausalMask(shape)

    def attend(query: Any, key: Any, value: Any, sinks: Any, window: int, chunk: int) -> Any:
        scale = query.shape[-1] ** -0.5

        def per_device(q: Any, k: Any, v: Any, *sink: Any) -> Any:
            if context > 1:
                k, v = (jax.lax.all_gather(t, "context", axis=2, tiled=True) for t in (k, v))
            heads_sinks = sink[0] if sink else None
            if splash:
                mask = masks.MultiHeadMask([mask_of(q.shape[2], k.shape[2], window, chunk)] * q.shape[1])
                kernel = kernels.make_splash_mha(mask=mask, head_shards=1, q_seq_shards=1)
                return jax.vmap(lambda a, b, c: kernel(a, b, c, sinks=heads_sinks))(q * scale, k, v)
            allowed = jnp.asarray(mask_of(q.shape[2], k.shape[2], window, chunk)[:, :])
            scores = jnp.einsum("bhqd,bhkd->bhqk", q, k).astype(jnp.float32) * scale
            scores = jnp.where(allowed, scores, -jnp.inf)
            if heads_sinks is not None:
                column = jnp.broadcast_to(heads_sinks.astype(jnp.float32)[None, :, None, None], (*scores.shape[:-1], 1))
                probabilities = jax.nn.softmax(jnp.concatenate([scores, column], axis=-1), axis=-1)[..., :-1]
            else:
                probabilities = jax.nn.softmax(scores, axis=-1)
            return jnp.einsum("bhqk,bhkd->bhqd", probabilities.astype(q.dtype), v)

        arrays = [jax_view(t) for t in (query, key, value)]
        in_specs = [spec, spec, spec]
        if sinks is not None:
            arrays.append(jax_view(sinks))
            in_specs.append(PartitionSpec("tensor"))
        sharded = jax.shard_map(per_device, mesh=mesh, in_specs=tuple(in_specs), out_specs=spec, check_vma=False)
        return torch_view(sharded(*arrays))

    return attend


__all__ = ["ScannedBlocks", "embedding_without_index_sort", "name_block_tensors", "sharded_attention"]
