"""Checks of the decoder shape's family-specific keys, and what Gemma 3n / Gemma 4's small models add.

Kept apart from model/decoders/decoder_shape.py (which calls them from `DecoderShape.check`) so that module
stays one screenful of keys. The shape arrives as an argument: this module imports nothing of it.

Gemma 3n and Gemma 4's small models (E2B, E4B), all off by default, as transformers builds them
(models/gemma4/modeling_gemma4.py and configuration_gemma4.py, transformers 5.25.0:
https://github.com/huggingface/transformers/blob/v5.25.0/src/transformers/models/gemma4/modeling_gemma4.py)
and MaxText runs them (src/maxtext/models/gemma4_small.py at 1fecb0f:
https://github.com/AI-Hypercomputer/maxtext/blob/1fecb0f17dab37d237f946052a07a8f51d8e1975/src/maxtext/models/gemma4_small.py):

- ``kv_shared_layers`` (``num_kv_shared_layers``): the last N layers project no keys or values
  (no key/value projections, no key norm); each attends with the keys and values of the last
  earlier layer of its own kind (local or global), its "donor", as computed there (normed and
  turned). The decoder runs the shared layers as the stack the planner scans, with the donors'
  keys and values as inputs to every step, and the layers before them unrolled (model/decoders/decoder.py).
- ``per_layer_input`` (``hidden_size_per_layer_input``) and ``per_layer_vocab``
  (``vocab_size_per_layer_input``; 0: vocab): a second embedding table of ``layers x
  per_layer_input`` columns and a projection of the embeddings to as many, normed per layer,
  give each layer a per_layer_input-wide input; after its MLP a layer adds
  norm(project(activation(gate(x)) x its input)) to the residual.
- ``double_wide_mlp`` (``use_double_wide_mlp``): the KV-shared layers' MLP is 2 x mlp wide.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpu_tuner.core.errors import WorkloadError


def check_gpt_oss_keys(shape: Any, where: str | Path) -> None:
    """gpt-oss's MoE keys (router_bias, expert_bias, the clamped SwiGLU's), as a one-line WorkloadError."""
    if (shape.router_bias or shape.expert_bias) and not shape.experts:
        raise WorkloadError("router_bias and expert_bias need routed experts: give experts", where)
    if shape.activation == "clamped_swiglu" and not shape.gated:
        raise WorkloadError("activation clamped_swiglu reads a gate and an up projection: it needs gated = true", where)
    if shape.swiglu_alpha <= 0 or shape.swiglu_limit <= 0:
        raise WorkloadError(
            f"swiglu_alpha and swiglu_limit must be above 0, not {shape.swiglu_alpha} and {shape.swiglu_limit}", where
        )


def kv_donor(shape: Any, layer: int) -> int | None:
    """The layer whose keys and values KV-shared layer `layer` reads (the last layer before the
    shared ones of the same kind, local or global), or None for a layer that projects its own."""
    if not shape.is_kv_shared(layer):
        return None
    first = shape.layers - shape.kv_shared_layers
    kind = shape.is_global(layer)
    return next((i for i in range(first - 1, -1, -1) if shape.is_global(i) == kind), None)


def kv_donors(shape: Any) -> frozenset[int]:
    """Every layer whose keys and values some KV-shared layer reads."""
    return frozenset(d for i in range(shape.layers) if (d := kv_donor(shape, i)) is not None)


def check_layer_sharing(shape: Any, where: str | Path) -> None:
    """The Gemma 3n / Gemma 4 keys (the module docstring), as a one-line WorkloadError."""
    if not 0 <= shape.kv_shared_layers < shape.layers:
        raise WorkloadError(
            f"kv_shared_layers must be 0 to layers - 1 ({shape.layers - 1}), not {shape.kv_shared_layers}", where
        )
    if min(shape.per_layer_input, shape.per_layer_vocab) < 0 or (shape.per_layer_vocab and not shape.per_layer_input):
        raise WorkloadError(
            "per_layer_input and per_layer_vocab must be at least 0; per_layer_vocab needs the first", where
        )
    if shape.per_layer_input and shape.activation not in ("silu", "gelu", "gelu_tanh", "relu"):
        raise WorkloadError(f"the per-layer input's gate has no activation {shape.activation!r}", where)
    if shape.double_wide_mlp and (not shape.kv_shared_layers or shape.experts):
        raise WorkloadError("double_wide_mlp widens the dense MLP of KV-shared layers: give kv_shared_layers", where)
    if not shape.kv_shared_layers:
        return
    if shape.kv_lora_rank:
        raise WorkloadError("kv_shared_layers shares projected keys and values: not with latent attention", where)
    first = shape.layers - shape.kv_shared_layers
    missing = [i for i in range(first, shape.layers) if kv_donor(shape, i) is None]
    if missing:
        raise WorkloadError(
            f"KV-shared layer {missing[0]} has no earlier layer of its kind (local or global) to read keys and "
            f"values from: fewer kv_shared_layers",
            where,
        )


__all__ = ["check_gpt_oss_keys", "check_layer_sharing", "kv_donor", "kv_donors"]
