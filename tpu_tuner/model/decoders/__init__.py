"""The generic decoder the planner builds: from a shape (``decoder:...``, a ``shape.toml``) or
a Hugging Face config, with every layer's attention as today's models define it. Imports no other
room of `model/` (the workloads room's loader builds a shape's workload from here).

* `decoder_shape.py`: the shape (`DecoderShape`) read from TOML or an inline spec, with its keys
  (`shape_keys.py`) and its family checks (`shape_checks.py`: gpt-oss, Gemma 3n / 4's small models);
* `decoder.py`: the `Decoder` module and the native contract built from a shape (`shape_module`);
* `layer_parts.py`, `attention.py`, `latent_attention.py`, `experts.py`: its layers (norms, rotary
  turn, MLP; local and chunked attention with sinks; MLA; the dropping and dropless MoE);
* `attention_pattern.py`: which attention each layer of a Hugging Face config runs;
* `hf_decoder.py`: a Hugging Face decoder's config as a `DecoderShape`;
* `transformer_dims.py`: the attention shape any transformer declares for the model-FLOPs formula
  (`TransformerDims`, each layer's `AttentionSpan`), which the decoder builds for its shapes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpu_tuner.core.lazy import lazy_exports

if TYPE_CHECKING:
    from tpu_tuner.model.decoders.attention_pattern import read_attention
    from tpu_tuner.model.decoders.decoder import Decoder, shape_module
    from tpu_tuner.model.decoders.decoder_shape import INLINE_PREFIX, DecoderShape, is_shape_source, read_shape
    from tpu_tuner.model.decoders.hf_decoder import max_positions
    from tpu_tuner.model.decoders.transformer_dims import AttentionSpan, TransformerDims

# Imported on first use (PEP 562): the face imports none of its modules, and so no torch.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Decoder": f"{__name__}.decoder",
        "shape_module": f"{__name__}.decoder",
        "DecoderShape": f"{__name__}.decoder_shape",
        "INLINE_PREFIX": f"{__name__}.decoder_shape",
        "is_shape_source": f"{__name__}.decoder_shape",
        "read_shape": f"{__name__}.decoder_shape",
        "read_attention": f"{__name__}.attention_pattern",
        "max_positions": f"{__name__}.hf_decoder",
        "AttentionSpan": f"{__name__}.transformer_dims",
        "TransformerDims": f"{__name__}.transformer_dims",
    },
)

__all__ = [
    "AttentionSpan",
    "Decoder",
    "DecoderShape",
    "INLINE_PREFIX",
    "TransformerDims",
    "is_shape_source",
    "max_positions",
    "read_attention",
    "read_shape",
    "shape_module",
]
