"""A transformers model's ``sdpa`` attention with a plain causal mask left to SDPA's ``is_causal``.

Under ``torch.compile`` transformers always materialises the causal mask it hands
``scaled_dot_product_attention``: with torch before 2.14 it never skips the mask while dynamo
traces, and a batch without an attention mask is checked for sequences packed into one row, a
check it cannot make while tracing, so it builds the packed-sequence mask. A kernel that takes no
mask, TorchTPU's splash attention, then never serves a compiled transformers model (the
`attention_kernel` knob's replacement passes every masked call to torch's own SDPA: the chip's
"splash" figures on the Llama-class model, 2026-12-07, were torch's SDPA).

`leave_causal_mask_to_kernel` switches such a model to an attention implementation registered
through transformers' public interfaces (``AttentionInterface``, ``AttentionMaskInterface``):
transformers' own ``sdpa_attention_forward``, and a mask function that returns no mask, so that
SDPA runs with ``is_causal=True``, where the batch gave no attention mask (no padding), the layer
has no window or chunk shorter than the keys, queries are as long as keys and start at 0 (no
cache). Every other mask is transformers' ``sdpa_mask``, unchanged. Its one departure from
``sdpa``: sequences packed into one row without an attention mask are not kept apart (tpu-tune's
batches pack nothing; splash has no mask to keep them apart with).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

CAUSAL_SDPA = "tpu_tune_causal_sdpa"  # the registered implementation's name


def leave_causal_mask_to_kernel(model: nn.Module) -> nn.Module:
    """`model` (in place) switched from ``sdpa`` to `CAUSAL_SDPA`; any other model unchanged."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return model
    _register()
    model.set_attn_implementation(CAUSAL_SDPA)  # type: ignore[operator]  # nn.Module.__getattr__'s type
    return model


@cache
def _register() -> None:
    """Register `CAUSAL_SDPA` with transformers, once a process."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import sdpa_mask

    def causal_or_sdpa_mask(
        *,
        q_length: int,
        kv_length: int,
        q_offset: Any = 0,
        attention_mask: Any = None,
        local_size: int | None = None,
        **kwargs: Any,
    ) -> Any:
        plain = (
            attention_mask is None  # no padding mask given
            and (local_size is None or local_size >= kv_length)  # no window or chunk that cuts
            and isinstance(q_offset, int)  # a static cache's tensor offset is not read here
            and q_offset == 0
            and q_length == kv_length  # SDPA's is_causal aligns upper-left: right only when equal
            and getattr(kwargs.get("config"), "vision_config", None) is None  # image tokens see each other
        )
        if plain:
            return None
        return sdpa_mask(
            q_length=q_length,
            kv_length=kv_length,
            q_offset=q_offset,
            attention_mask=attention_mask,
            local_size=local_size,
            **kwargs,
        )

    AttentionInterface.register(CAUSAL_SDPA, sdpa_attention_forward)
    AttentionMaskInterface.register(CAUSAL_SDPA, causal_or_sdpa_mask)
