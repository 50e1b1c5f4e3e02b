"""Apply a batch size to inputs whose shapes a file fixes (the benchmark convention's get_inputs()).

The rule (docs/flops.md, "Batch size of benchmark-style files"): the batch dimension is dimension
0, and its size is that of the first tensor of one dimension or more. Every tensor whose
dimension 0 has that size is resized to the new batch: sliced when smaller, repeated cyclically
(rows 0, 1, ..., B-1, 0, 1, ...) when larger. Tensors of another leading size (a weight, a mask of
another shape), scalars and non-tensors are left as they are.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map


def leading_size(inputs: Any) -> int | None:
    """Dimension 0 of the first tensor (of one dimension or more) among `inputs`: the batch."""
    for tensor in tree_flatten(inputs)[0]:
        if isinstance(tensor, torch.Tensor) and tensor.dim() > 0:
            return int(tensor.shape[0])
    return None


def resize_batch(inputs: Any, batch_size: int) -> Any:
    """`inputs` with every tensor of the common leading size resized to `batch_size` rows."""
    leading = leading_size(inputs)
    if leading is None or leading == batch_size or leading == 0:
        return inputs

    def resize(value: Any) -> Any:
        if not (isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == leading):
            return value
        if batch_size <= leading:
            return value[:batch_size].clone()
        rows = torch.arange(batch_size, device=value.device) % leading
        return value.index_select(0, rows)

    return tree_map(resize, inputs)


def batch_size_of(obj: Any) -> int | None:
    """The first dimension of the first tensor in `obj` (a tensor, dict, tuple or list)."""
    if isinstance(obj, torch.Tensor):
        return obj.shape[0] if obj.dim() else None
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (tuple, list)) else ()
    return next((size for value in values if (size := batch_size_of(value)) is not None), None)


def batch_slice(obj: Any, size: int, k: int, index: int) -> Any:
    """Slice `index` of `k` equal slices along the batch dimension (`size`); tensors whose first
    dimension is not the batch's travel whole."""
    if isinstance(obj, torch.Tensor):
        return obj.chunk(k)[index] if obj.dim() and obj.shape[0] == size else obj
    if isinstance(obj, dict):
        return {key: batch_slice(value, size, k, index) for key, value in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(batch_slice(value, size, k, index) for value in obj)
    return obj
