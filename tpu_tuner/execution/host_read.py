"""Reading a step's result to the host: a float computed from every element of some tensors,
what ends a timed block of steps (execution/timer.py, execution/step.py's `result_read`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) parameter's local shard, read with no collective; any other as it is."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def float_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in an output (a tensor, or mappings and sequences of them, as a Hugging Face
    model's output is), each as a float one (a norm needs one)."""
    if isinstance(value, torch.Tensor):
        tensor = local_tensor(value)
        return [tensor if tensor.is_floating_point() else tensor.float()]
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in float_tensors(item)]
    return []


def read_total(tensors: list[torch.Tensor]) -> float:
    """The sum of the tensors' norms, on the host: one fused norm per dtype where the backend has
    it, so a block's read launches a few programs, not one per tensor."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in tensors:
        if tensor.numel():
            by_dtype.setdefault(tensor.dtype, []).append(tensor.detach())
    with torch.no_grad():
        sums = [torch.stack(torch._foreach_norm(group)).float().sum() for group in by_dtype.values()]
        return float(torch.stack(sums).sum().item()) if sums else 0.0
