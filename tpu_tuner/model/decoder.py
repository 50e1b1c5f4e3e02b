"""A generic decoder-only transformer built from a shape: what `tpu-tune plan shape.toml` plans.

The shape (`DecoderShape`, model/decoder_shape.py) comes from a small TOML file, an inline
``decoder:d_model=4096,layers=32,heads=32`` spec, or a Hugging Face config of a family the
planner maps (model/hf_decoder.py). Llama-style by default (gated SiLU MLP, RMSNorm, rotary
positions, grouped-query attention). The module names are Llama's (``wq``/``wk``/``wv``/``wo``,
``w_gate``/``w_up``/``w_down``): the planner places weights by structure, and a user's own file
(examples/llama.py) stays the example of a model of one's own.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from tpu_tuner.model.attention import Attention
from tpu_tuner.model.decoder_shape import INLINE_PREFIX, DecoderShape, is_shape_source, read_shape
from tpu_tuner.model.experts import MixtureOfExperts
from tpu_tuner.model.latent_attention import LatentAttention
from tpu_tuner.model.layer_parts import FeedForward, RMSNorm
from tpu_tuner.model.workload import AttentionSpan


def _norm(shape: DecoderShape) -> nn.Module:
    # nn.LayerNorm carries a bias, as GPT-2's and GPT-NeoX's do.
    return (
        RMSNorm(shape.d_model, shape.norm_eps) if shape.norm == "rms" else nn.LayerNorm(shape.d_model, shape.norm_eps)
    )


class Block(nn.Module):
    def __init__(self, s: DecoderShape, layer: int = 0) -> None:
        super().__init__()
        self.parallel = s.parallel_residual
        self.attention_norm = _norm(s)
        self.attention = LatentAttention(s) if s.kv_lora_rank else Attention(s, layer)
        # A global layer whose heads are wider than the local ones turns them with its own table.
        self.global_rope_table = not s.kv_lora_rank and self.attention.head_dim != s.n_head_dim
        self.attention_post_norm = _norm(s) if s.post_norms else None
        self.ffn_norm = _norm(s)
        self.feed_forward = MixtureOfExperts(s) if s.has_experts(layer) else FeedForward(s)
        self.ffn_post_norm = _norm(s) if s.post_norms else None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        cos_global: torch.Tensor | None = None,
        sin_global: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if self.global_rope_table:
            cos, sin = cos_global, sin_global
        attended = self.attention(self.attention_norm(x), cos, sin)
        if self.attention_post_norm is not None:
            attended = self.attention_post_norm(attended)
        # GPT-NeoX's parallel residual: the MLP reads the block's input, not the attention's sum.
        mlp_input = x if self.parallel else x + attended
        fed = self.feed_forward(self.ffn_norm(mlp_input))
        if self.ffn_post_norm is not None:
            fed = self.ffn_post_norm(fed)
        return x + attended + fed


class LayerGroup(nn.Module):
    """One repeat of a layer pattern (Gemma 3's 5 local layers and 1 global, say): the unit the
    planner scans, as MaxText scans its pattern blocks."""

    def __init__(self, s: DecoderShape, first: int, period: int) -> None:
        super().__init__()
        self.members = nn.ModuleList(Block(s, first + i) for i in range(period))

    def forward(self, x: torch.Tensor, *rope: torch.Tensor | None) -> torch.Tensor:
        for block in self.members:
            x = block(x, *rope)
        return x


class Decoder(nn.Module):
    """A decoder-only transformer of `shape` (token ids in, logits out).

    Its layers are `layers`, a ModuleList of like units the planner scans: the blocks themselves
    for a uniform model, or `LayerGroup`s of a layer pattern; layers outside the repeats (a
    leading run of dense layers, a partial pattern at the end) are `leading` and `trailing`
    (DecoderShape.layer_groups)."""

    scanned_blocks = "layers"  # model/blocks.py: the stack the planner scans, when there are several
    # Buffers registered by _rope_tables for rotary positions (the _global pair only where global
    # layers' head width differs); declared so their type is known.
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor
    rope_cos_global: torch.Tensor
    rope_sin_global: torch.Tensor

    def __init__(self, shape: DecoderShape) -> None:
        super().__init__()
        self.shape = shape
        self.tok_embeddings = nn.Embedding(shape.vocab, shape.d_model)
        self.pos_embeddings = nn.Embedding(shape.max_seq_len, shape.d_model) if shape.positions == "learned" else None
        leading, period, groups = shape.layer_groups()
        repeated = range(leading, leading + period * groups, period)
        self.layers = nn.ModuleList(Block(shape, i) if period == 1 else LayerGroup(shape, i, period) for i in repeated)
        self.leading = nn.ModuleList(Block(shape, i) for i in range(leading)) if leading else None
        rest = range(leading + period * groups, shape.layers)
        self.trailing = nn.ModuleList(Block(shape, i) for i in rest) if len(rest) else None
        self.norm = _norm(shape)
        self.output = nn.Linear(shape.d_model, shape.vocab, bias=False)
        if shape.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight
        if shape.positions == "rope":
            self._rope_tables("", shape.rotary_dim)
            _, _, global_dim = shape.attention_heads(shape.global_every - 1 if shape.global_every else 0)
            if global_dim != shape.n_head_dim:
                self._rope_tables("_global", int(global_dim * shape.rotary_fraction))

    def blocks(self) -> list[Block]:
        """Every layer's block, in order (however the layers are grouped)."""
        return [
            cast(Block, member)
            for stack in (self.leading, self.layers, self.trailing)
            for unit in stack or ()
            for member in (unit.members if isinstance(unit, LayerGroup) else [unit])
        ]

    def _rope_tables(self, suffix: str, rotated: int) -> None:
        inv_freq = 1.0 / (self.shape.rope_theta ** (torch.arange(0, rotated, 2, dtype=torch.float32) / rotated))
        angles = torch.outer(torch.arange(self.shape.max_seq_len, dtype=torch.float32), inv_freq)
        self.register_buffer(f"rope_cos{suffix}", angles.cos(), persistent=False)
        self.register_buffer(f"rope_sin{suffix}", angles.sin(), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.output(self.hidden(tokens))

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """The final norm's output, before the output head (the planner's vocabulary tiling
        computes the head's logits a tile of tokens at a time: planner/vocab_tiling.py)."""
        seq = tokens.shape[1]
        x = self.tok_embeddings(tokens)
        rope: tuple[torch.Tensor | None, ...] = (None, None)
        if self.pos_embeddings is not None:
            x = x + self.pos_embeddings(torch.arange(seq, device=tokens.device))
        else:
            rope = (self.rope_cos[:seq], self.rope_sin[:seq])
            if hasattr(self, "rope_cos_global"):
                rope += (self.rope_cos_global[:seq], self.rope_sin_global[:seq])
        for stack in (self.leading, self.layers, self.trailing):
            for layer in stack or ():
                x = layer(x, *rope)
        return self.norm(x)


def attention_spans(shape: DecoderShape) -> tuple[AttentionSpan, ...]:
    """Every layer's attention as the FLOPs formula reads it (metrics/flops.py)."""
    spans = []
    for layer in range(shape.layers):
        heads, _, head_dim = shape.attention_heads(layer)
        window, chunk = shape.attention_span(layer)
        spans.append(AttentionSpan(heads, head_dim, window, chunk))
    return tuple(spans)


def shape_module(path: str | Path) -> types.ModuleType:
    """A module with the native contract (build_model, make_batch, loss, BATCH_SIZE, SEQ_LEN,
    TRANSFORMER) for the shape at `path`: the loader reads it as it reads a user's file."""
    shape, sizes, name = read_shape(path)
    return decoder_module(shape, name, sizes.get("batch_size", 1), sizes.get("seq_len", min(2048, shape.max_seq_len)))


def decoder_module(shape: DecoderShape, name: str, batch_size: int, seq_len: int) -> types.ModuleType:
    """The native contract of the decoder of `shape` (next-token cross-entropy on random tokens),
    named `name`, with BATCH_SIZE and SEQ_LEN the step's default sizes."""
    module = types.ModuleType(f"tpu_tune_decoder_{name}")

    def build_model() -> nn.Module:
        return Decoder(shape)

    def make_batch(batch_size: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, shape.vocab, (batch_size, seq_len + 1))
        return tokens[:, :-1], tokens[:, 1:]

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))

    # A module built at run time: its attributes are set through its namespace.
    vars(module).update(
        build_model=build_model,
        make_batch=make_batch,
        loss=loss,
        BATCH_SIZE=batch_size,
        SEQ_LEN=seq_len,
        TRANSFORMER={
            "layers": shape.layers,
            "heads": shape.heads,
            "head_dim": shape.n_head_dim,
            "causal": True,
            "spans": attention_spans(shape) if shape.has_local_layers else (),
            **({"value_head_dim": shape.v_head_dim} if shape.kv_lora_rank else {}),
        },
        NAME=name,
        SHAPE=shape,
    )
    return module


__all__ = [
    "Decoder",
    "DecoderShape",
    "INLINE_PREFIX",
    "LayerGroup",
    "attention_spans",
    "decoder_module",
    "is_shape_source",
    "read_shape",
    "shape_module",
]
