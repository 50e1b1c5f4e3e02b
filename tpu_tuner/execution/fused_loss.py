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
nothing vocabulary-sized backward. `FusedCrossEntropy` allocates just that on fake tensors; what
it was measured against is in docs/tuning.md ("Memory before measurement").

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
        row_lse = logits.new_empty(logits.shape[:-1])
        ctx.save_for_backward(logits, row_lse)
        return row_lse.new_empty(()) if reduction != "none" else row_lse.new_empty(row_lse.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        logits, _ = ctx.saved_tensors
        return logits.detach(), None  # the donated buffer: no new vocabulary-sized tensor


class FusedCrossEntropy(TorchFunctionMode):
    """While active, ``F.cross_entropy`` on logits that need a gradient allocates what a fused
    kernel does (a fake step's stand-in: the values are not computed); other calls run as they
    are."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.cross_entropy and args:
            logits = args[0]
            reduction = kwargs.get("reduction", args[6] if len(args) > 6 else "mean")
            # torch's legacy size_average / reduce arguments override `reduction`: left as they are.
            legacy = any(kwargs.get(name) is not None for name in ("size_average", "reduce")) or any(
                arg is not None for arg in args[3:6:2]
            )
            if isinstance(logits, torch.Tensor) and logits.requires_grad and reduction in REDUCTIONS and not legacy:
                return _FusedCrossEntropyFunction.apply(logits, reduction)
        return func(*args, **kwargs)
