"""A transformer's attention shape as the model-FLOPs formula reads it (`TransformerDims`, with
each layer's `AttentionSpan` where layers differ).

A user's file declares one (``transformer_dims()``, `Workload.transformer`); the generic decoder
and the Hugging Face reader build them for every shape they read. Its own module, with no torch,
so that the decoder's modules take the type without importing the workload.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionSpan:
    """One layer's attention as the model-FLOPs formula reads it: its heads and head width, and its
    sliding window or chunk (0, 0: the whole causal sequence). The prediction's hardware floor
    also reads the layer's key/value heads and MLP width where they are given (None: the model's)."""

    heads: int
    head_dim: int
    window: int = 0
    chunk: int = 0
    kv_heads: int | None = None  # 0: the layer projects no keys or values (Gemma 4's KV-shared layers)
    mlp: int | None = None  # its MLP's width (Gemma 4 E2B's double-wide MLPs)


@dataclass(frozen=True)
class TransformerDims:
    """Attention shape of a transformer, for the analytical model-FLOPs formula.

    `causal` says whether attention is masked causally; the FLOPs convention decides whether
    that halves the attention term (MaxText) or not (PaLM / nanoGPT / torchtitan). `spans`, where
    layers differ (local windows, chunks, wider global heads), gives every layer's attention;
    empty: `layers` layers of `heads` x `head_dim` over the whole sequence.
    """

    layers: int
    heads: int
    head_dim: int
    causal: bool = True
    spans: tuple[AttentionSpan, ...] = ()
    value_head_dim: int | None = None  # where value heads are narrower or wider than query/key heads (MLA)
