"""A model's dimensions, read off a (meta-device) model: what the planner and the sharding layouts
need (width, depth, heads, vocabulary), and its token embedding."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from tpu_tuner.model.meshes.layouts import ModelShape
from tpu_tuner.model.workloads.blocks import blocks_of, layer_count, unscanned_blocks

HEAD_ATTRS = ("n_heads", "num_heads", "n_head", "num_attention_heads")
KV_HEAD_ATTRS = ("n_kv_heads", "num_key_value_heads", "num_kv_heads", "n_kv_head")


@dataclass(frozen=True)
class Dims:
    """The model's shape (`shape.n_layers`: its transformer layers) and `scanned`: how many units
    the planner's block loop runs (the layers, or the repeats of a layer pattern)."""

    shape: ModelShape
    head_dim: int
    scanned: int = 0
    unscanned: int = 0  # blocks beside the loop, run unrolled (leading dense layers, a partial pattern)
    # A mixture of experts' routing, as the HBM estimate sizes its dispatch (planner/prediction/hbm_estimate.py):
    # routed experts a layer holds and a token's choices (0: dense), the capacity factor (0: dropless).
    experts: int = 0
    top_k: int = 0
    capacity_factor: float = 0.0
    # Lookup tables besides the token embedding (Gemma 3n / 4's per-layer inputs): their parameters
    # and the summed width a token reads from them.
    side_table_parameters: int = 0
    side_table_width: int = 0

    @property
    def saved_block_inputs(self) -> int:
        """How many block inputs the backward keeps under full remat: one per loop iteration and
        one per unrolled block."""
        return (self.scanned + self.unscanned) or self.shape.n_layers


def token_embedding(model: nn.Module) -> nn.Embedding | None:
    """The model's token embedding: its largest `nn.Embedding` (None without one)."""
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    return max(embeddings, key=lambda m: m.num_embeddings) if embeddings else None


def read_dims(model: nn.Module, heads_hint: int | None = None) -> Dims:
    """d_model and vocabulary from the embedding, depth from the repeated blocks, heads from the
    attention module's attributes (or `heads_hint`), the MLP width from the widest block Linear."""
    embedding = token_embedding(model)
    if embedding is None:
        raise ValueError("the planner needs a token embedding (nn.Embedding) to find d_model and the vocabulary")
    d_model, vocab = embedding.embedding_dim, embedding.num_embeddings
    blocks_name, blocks = blocks_of(model)
    block = blocks[0]
    members = getattr(block, "members", None)
    if isinstance(members, nn.ModuleList):  # one repeat of a layer pattern: read its first layer
        block = members[0]
    heads = _attr(block, HEAD_ATTRS) or heads_hint
    if not heads:
        raise ValueError("cannot find the number of attention heads (an n_heads attribute or TRANSFORMER['heads'])")
    # The generic decoder's attention names its key/value heads `kv_heads`.
    kv_heads = _attr(block, (*KV_HEAD_ATTRS, "kv_heads")) or heads
    head_dim = _attr(block, ("head_dim",)) or d_model // heads
    widths = [m.out_features for m in block.modules() if isinstance(m, nn.Linear) and m.in_features == d_model]
    # A mixture of experts keeps its MLPs as stacked [experts, d_model, width] weights.
    widths += [p.shape[2] for p in block.parameters() if p.dim() == 3 and p.shape[1] == d_model]
    mlp_hidden = max(widths) if widths else 4 * d_model
    # A mixture of experts: the generic decoder's (n_experts, top_k; a capacity factor unless
    # dropless) or a traced Hugging Face one's (num_experts or num_local_experts, top_k), routed dropless.
    experts = top_k = 0
    capacity = 0.0
    for module in model.modules():
        n = next(
            (
                v
                for a in ("n_experts", "num_experts", "num_local_experts")
                if isinstance(v := getattr(module, a, None), int)
            ),
            0,
        )
        k = next((v for a in ("top_k", "num_experts_per_tok") if isinstance(v := getattr(module, a, None), int)), 0)
        if n > 0 and k > 0:
            dropping = not getattr(module, "dropless", True)
            experts, top_k, capacity = n, k, float(getattr(module, "capacity_factor", 0.0)) if dropping else 0.0
            break
    side = [m for m in model.modules() if isinstance(m, nn.Embedding) and m is not embedding]
    return Dims(
        ModelShape(d_model, heads, kv_heads, mlp_hidden, vocab, layer_count(model)),
        head_dim,
        len(blocks),
        len(unscanned_blocks(model, blocks_name)),
        experts,
        top_k,
        capacity,
        sum(m.weight.numel() for m in side),
        sum(m.embedding_dim for m in side),
    )


def _attr(module: nn.Module, names: tuple[str, ...]) -> int | None:
    for sub in module.modules():
        for name in names:
            value = getattr(sub, name, None)
            if isinstance(value, int) and value > 0:
                return value
    return None
