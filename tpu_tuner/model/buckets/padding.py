"""The runtime helper: pad a batch to its bucket in the user's data pipeline (never truncate)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import torch


def bucket_for(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket bound that holds `length`; ValueError when none does."""
    ordered = sorted(buckets)
    index = bisect.bisect_left(ordered, length)
    if index == len(ordered):
        raise ValueError(f"length {length} is longer than the largest bucket {ordered[-1]}; buckets never truncate")
    return ordered[index]


def pad_to_bucket(
    sequences: Sequence[torch.Tensor] | torch.Tensor,
    buckets: Sequence[int],
    pad_value: int = 0,
    lengths: Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad a batch to the bucket of its longest sequence.

    `sequences` is a list of 1-D (or [length, ...]) tensors of varying length, or an already
    stacked [batch, length, ...] tensor with `lengths` giving each row's real length. Returns
    (padded [batch, bucket, ...], attention_mask [batch, bucket] with True on real tokens).
    """
    if isinstance(sequences, torch.Tensor):
        if lengths is None:
            lengths = [sequences.shape[1]] * sequences.shape[0]
        rows = [sequences[i, : lengths[i]] for i in range(sequences.shape[0])]
    else:
        rows = list(sequences)
        lengths = [row.shape[0] for row in rows]
    if not rows:
        raise ValueError("an empty batch has no bucket")
    bound = bucket_for(max(lengths), buckets)
    first = rows[0]
    padded = torch.full((len(rows), bound, *first.shape[1:]), pad_value, dtype=first.dtype, device=first.device)
    mask = torch.zeros(len(rows), bound, dtype=torch.bool, device=first.device)
    for i, (row, length) in enumerate(zip(rows, lengths, strict=True)):
        padded[i, :length] = row[:length]
        mask[i, :length] = True
    return padded, mask
