"""A built model's `WorkloadTraits`, read in the profiling worker (which has imported the file).

Apart from the record (`knobs/traits.py`) because the reading asks the knobs what they see in a
model (`attention_kernel.calls_sdpa`, `attn_implementation.offered`) while every knob names the
record to narrow itself: the record sits below the knobs, this reader above the ones it asks.
"""

from __future__ import annotations

import math

from torch import nn

from tpu_tuner.knobs.attention_kernel import calls_sdpa
from tpu_tuner.knobs.attn_implementation import offered
from tpu_tuner.knobs.traits import WorkloadTraits
from tpu_tuner.model.workloads.blocks import repeated_blocks
from tpu_tuner.parallel.apply import tensor_widths


def of_model(model: nn.Module, training: bool, batch_size: int | None) -> WorkloadTraits:
    """The traits of a built model (called in the worker, which has imported the file)."""
    widths = list(tensor_widths(model).values())
    return WorkloadTraits(
        training=training,
        conv_weights=sum(1 for p in model.parameters() if p.dim() == 4),
        repeated_blocks=len(repeated_blocks(model)),
        batch_size=batch_size,
        tensor_divisor=math.gcd(*widths) if widths else None,
        attention_implementations=offered(model),
        linear_layers=sum(1 for m in model.modules() if isinstance(m, nn.Linear)),
        scaled_dot_product_attention=calls_sdpa(model),
    )
