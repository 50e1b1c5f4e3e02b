"""The loss over the vocabulary in tiles (MaxText's ``num_vocab_tiling``): never a whole step's logits.

A 262k-token vocabulary (Gemma 3) at 32k tokens a device makes a [tokens, vocab] logits buffer of
16 GiB in bf16, and the backward pass another: more than a v6e chip's HBM. MaxText splits the
tokens into tiles and computes each tile's logits, log-sum-exp and target logit in turn, keeping
none of them for the backward pass (each tile is recomputed there); the compiled program then holds
one tile's logits at a time. The planner compiles the same: a `jax.lax.scan` over tiles of the
sequence (each device its own batch rows, so the split needs no communication), its body under
`jax.checkpoint` with nothing saved.
"""

from __future__ import annotations

from typing import Any


def tiled_cross_entropy(hidden: Any, head: Any, targets: Any, tiles: int) -> Any:
    """Mean next-token cross-entropy of `hidden` [batch, seq, d_model] (the final norm's output)
    against `targets` [batch, seq], the logits `hidden @ head.T` (`head` [vocab, d_model], a torch
    Linear's weight) computed `tiles` slices of the sequence at a time."""
    import jax
    import jax.numpy as jnp

    batch, seq, width = hidden.shape
    if seq % tiles:
        raise ValueError(f"{tiles} vocabulary tiles do not divide the sequence of {seq} tokens")
    # [tiles, batch, seq / tiles, ...]: the scan walks the sequence, every device keeps its batch rows.
    hidden_tiles = jnp.moveaxis(hidden.reshape(batch, tiles, seq // tiles, width), 1, 0)
    target_tiles = jnp.moveaxis(targets.reshape(batch, tiles, seq // tiles), 1, 0)

    @jax.checkpoint
    def tile(total: Any, pair: tuple[Any, Any]) -> tuple[Any, None]:
        rows, wanted = pair
        logits = jnp.einsum("bsd,vd->bsv", rows, head)
        lse = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
        target_logit = jnp.take_along_axis(logits, wanted[..., None], axis=-1)[..., 0].astype(jnp.float32)
        return total + (lse - target_logit).sum(), None

    total, _ = jax.lax.scan(tile, jnp.zeros((), jnp.float32), (hidden_tiles, target_tiles))
    return total / (batch * seq)


__all__ = ["tiled_cross_entropy"]
