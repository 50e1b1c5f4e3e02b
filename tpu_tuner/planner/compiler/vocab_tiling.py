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


def cross_entropy(logits: Any, targets: Any) -> Any:
    """Per-token next-token cross-entropy in fp32: the log-sum-exp of `logits` [..., vocab] less
    the target's logit, picked by a one-hot product as MaxText's loss picks it (``jax.nn.one_hot``
    and ``max_utils.cross_entropy_with_logits``, docs/planner.md, "The loss's target logit"). The
    fp32 log-sum-exp fuses into its reduction: no [tokens, vocab] fp32 copy of the logits."""
    import jax
    import jax.numpy as jnp

    lse = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
    # A product with the one-hot, not an element gather: libtpu 0.0.42 offloads such a gather of
    # large logits to SparseCore and fails there (a RET_CHECK in gather_emitter.cc).
    picked = logits * jax.nn.one_hot(targets, logits.shape[-1], dtype=logits.dtype)
    return lse - jnp.sum(picked.astype(jnp.float32), axis=-1)


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
        return total + cross_entropy(logits, wanted).sum(), None

    total, _ = jax.lax.scan(tile, jnp.zeros((), jnp.float32), (hidden_tiles, target_tiles))
    return total / (batch * seq)


__all__ = ["cross_entropy", "tiled_cross_entropy"]
