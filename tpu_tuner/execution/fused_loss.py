"""The memory of a cross-entropy loss that a compiler fuses with the model, on fake tensors.

The memory estimate runs a compiled step eagerly (`memory_estimate.py`), and an eager
``F.cross_entropy`` holds the vocabulary-sized tensors a fused one never makes: its
log-probabilities (saved for the backward), their gradient, and the logits' gradient beside both.
Where the loss is compiled with the model (``compile_scope = model+loss``) inductor writes the
forward as one reduction over the logits (a log-sum-exp a row, kept for the backward with the
logits) and the backward as one elementwise kernel whose output takes the saved logits' own
buffer: AOTAutograd hands saved tensors the backward alone reads to it as donated buffers
(``torch._functorch.config.donated_buffer``, on by default since torch 2.5), and inductor reuses
a dead input's buffer for a same-sized output. So the fused loss adds one float a row forward and
nothing vocabulary-sized backward; where the loss upcasts bf16 logits first (``.float()``), the
cast is fused into that kernel too, and the bf16 logits are what is kept. `FusedCrossEntropy`
allocates just that on fake tensors; what it was measured against is in docs/tuning.md ("Memory
before measurement").

Installed only around the estimate's fake step (it computes no values), and only for a loss a
fusing backend compiles (`memory_estimate.fuses_loss`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

REDUCTIONS = ("mean", "sum", "none")


class _FusedCrossEntropyFunction(torch.autograd.Function):
    """Cross-entropy's memory as fused: a row's log-sum-exp kept with the logits; the gradient in
    the logits' own storage."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, reduction: str) -> torch.Tensor:
        rows = list(logits.shape)
        del rows[1 if logits.dim() >= 2 else 0]  # the classes: dim 1 of (N, C, ...), else the only one
        row_lse = logits.new_empty(rows)
        ctx.save_for_backward(logits, row_lse)
        return row_lse.new_empty(()) if reduction != "none" else row_lse.new_empty(row_lse.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        logits, _ = ctx.saved_tensors
        return logits.detach(), None  # the donated buffer: no new vocabulary-sized tensor


class _FusedUpcastFunction(torch.autograd.Function):
    """An upcast to float32 as a compiler fuses it into the kernels that read it: never written
    out. Its stand-in is a float32 tensor of one element broadcast to the shape (its readers
    still allocate their own outputs); the gradient is written in the input's saved buffer."""

    @staticmethod
    def forward(ctx: Any, low: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(low)
        return low.new_empty((), dtype=torch.float32).expand(low.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (low,) = ctx.saved_tensors
        return low.detach()


def _upcast(func: Any, args: Any, kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The activation (not a parameter) a ``Tensor.float()`` or ``Tensor.to(torch.float32)`` call
    upcasts from a 16-bit float and that needs a gradient, or None for any other call (a device or
    a copy asked for)."""
    if not args or not isinstance(args[0], torch.Tensor):
        return None
    tensor = args[0]
    # A parameter's upcast is read in place too, but its gradient is a buffer of its own.
    if tensor.dtype not in (torch.bfloat16, torch.float16) or not tensor.requires_grad or tensor.is_leaf:
        return None
    if func is torch.Tensor.float and len(args) == 1 and not kwargs:
        return tensor
    rest = [*args[1:], *kwargs.values()]
    if func is torch.Tensor.to and rest == [torch.float32] and set(kwargs) <= {"dtype"}:
        return tensor
    return None


class FusedCrossEntropy(TorchFunctionMode):
    """While active, ``F.cross_entropy`` on logits that need a gradient allocates what a fused
    kernel does, and so does an upcast of a 16-bit activation to float32 (the loss's ``.float()``:
    inductor reads the bf16 logits in its loss kernel); a fake step's stand-in, the values are
    not computed. Other calls run as they are."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        low = _upcast(func, args, kwargs)
        if low is not None:
            return _FusedUpcastFunction.apply(low)
        if func is F.cross_entropy and args:
            logits = args[0]
            reduction = kwargs.get("reduction", args[6] if len(args) > 6 else "mean")
            # torch's legacy size_average / reduce arguments override `reduction`: left as they are.
            legacy = any(kwargs.get(name) is not None for name in ("size_average", "reduce")) or any(
                arg is not None for arg in args[3:6:2]
            )
            computed = isinstance(logits, torch.Tensor) and logits.requires_grad and not logits.is_leaf
            if computed and reduction in REDUCTIONS and not legacy:
                return _FusedCrossEntropyFunction.apply(logits, reduction)
        return func(*args, **kwargs)
