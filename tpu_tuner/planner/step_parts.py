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

from tpu_tuner.planner.remat import block_tensor_roles


def name_block_tensors(blocks: nn.ModuleList, d_model: int, mlp_hidden: int) -> None:
    """Give the block tensors MaxText's checkpoint names (remat.block_tensor_roles), so that a
    policy can save or offload them: each projection's output, the out projection's input
    (``context``). Hooks on every block (unrolled) or the one template the scan calls."""
    from jax.ad_checkpoint import checkpoint_name
    from torchax.interop import jax_view, torch_view

    roles, context_of = block_tensor_roles(blocks[0], d_model, mlp_hidden)

    def named(name: str) -> Callable[..., Any]:
        def hook(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
            return torch_view(checkpoint_name(jax_view(output), name))
        return hook

    def named_context(module: nn.Module, args: tuple) -> tuple:
        return (torch_view(checkpoint_name(jax_view(args[0]), "context")), *args[1:])

    for block in blocks:
        for path, role in roles.items():
            block.get_submodule(path).register_forward_hook(named(role))
        if context_of is not None:
            block.get_submodule(context_of).register_forward_pre_hook(named_context)


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


def sharded_attention(env: Any, mesh: Any, flash: bool) -> None:
    """Run F.scaled_dot_product_attention per device: heads over the tensor axis, the batch over
    (data, fsdp), inside `shard_map`; with `flash` as TPU flash attention (Pallas), as MaxText does.

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
    from jax.sharding import PartitionSpec
    from torchax.interop import jax_view, torch_view

    spec = PartitionSpec(("data", "fsdp"), "tensor", "context", None)
    context = mesh.shape["context"]

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is not None or dropout_p or query.shape[1] % key.shape[1]:
            raise NotImplementedError("the planner's flash attention takes causal or full attention, no mask, and "
                                      "query heads a multiple of the key/value heads")
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
                q, k, v = (t if t.shape[-1] == head else jnp.pad(t, ((0, 0),) * 3 + ((0, head - t.shape[-1]),))
                           for t in (q, k, v))
                return pallas_flash.flash_attention(q, k, v, causal=causal, sm_scale=sm_scale)[..., :width]
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


__all__ = ["ScannedBlocks", "embedding_without_index_sort", "name_block_tensors", "sharded_attention"]
