"""A generic decoder-only transformer built from a shape: what `tpu-tune plan shape.toml` plans.

The shape (`DecoderShape`, model/decoders/decoder_shape.py) comes from a small TOML file, an inline
``decoder:d_model=4096,layers=32,heads=32`` spec, or a Hugging Face config of a family the
planner maps (model/decoders/hf_decoder.py). Llama-style by default (gated SiLU MLP, RMSNorm, rotary
positions, grouped-query attention). The module names are Llama's (``wq``/``wk``/``wv``/``wo``,
``w_gate``/``w_up``/``w_down``): the planner places weights by structure, and a user's own file
(examples/llama.py) stays the example of a model of one's own.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from tpu_tuner.model.decoders.attention import Attention
from tpu_tuner.model.decoders.decoder_shape import INLINE_PREFIX, DecoderShape, is_shape_source, read_shape
from tpu_tuner.model.decoders.experts import MixtureOfExperts
from tpu_tuner.model.decoders.latent_attention import LatentAttention
from tpu_tuner.model.decoders.layer_parts import ACTIVATIONS, FeedForward, RMSNorm
from tpu_tuner.model.decoders.shape_checks import kv_donors
from tpu_tuner.model.decoders.transformer_dims import AttentionSpan


def _norm(shape: DecoderShape) -> nn.Module:
    # nn.LayerNorm carries a bias, as GPT-2's and GPT-NeoX's do.
    return (
        RMSNorm(shape.d_model, shape.norm_eps) if shape.norm == "rms" else nn.LayerNorm(shape.d_model, shape.norm_eps)
    )


class PerLayerInput(nn.Module):
    """Gemma 3n / Gemma 4's per-layer input, after a layer's MLP: norm(project(activation(gate(x))
    x the layer's input)), added to the residual (transformers' Gemma4TextDecoderLayer)."""

    tensor_roles: dict[str, str] = {}  # no attention or MLP roles (remat.block_tensor_roles): gate, projection

    def __init__(self, s: DecoderShape) -> None:
        super().__init__()
        self.activation = ACTIVATIONS[s.activation]
        self.gate = nn.Linear(s.d_model, s.per_layer_input, bias=False)
        self.projection = nn.Linear(s.per_layer_input, s.d_model, bias=False)
        self.norm = _norm(s)

    def forward(self, x: torch.Tensor, layer_input: torch.Tensor) -> torch.Tensor:
        return self.norm(self.projection(self.activation(self.gate(x)) * layer_input))


class Block(nn.Module):
    layer_index: torch.Tensor  # with per-layer inputs: which of them is this layer's (a buffer, stacked by a scan)

    def __init__(self, s: DecoderShape, layer: int = 0) -> None:
        super().__init__()
        self.parallel = s.parallel_residual
        self.attention_norm = _norm(s)
        self.attention = LatentAttention(s) if s.kv_lora_rank else Attention(s, layer)
        # A global layer whose heads are wider than the local ones turns them with its own table.
        self.global_rope_table = not s.kv_lora_rank and self.attention.head_dim != s.n_head_dim
        self.kv_shared = s.is_kv_shared(layer)  # reads a donor's keys and values (model/decoders/shape_checks.py)
        self.kv_donor = bool(s.kv_shared_layers) and layer in kv_donors(s)
        self.attention_post_norm = _norm(s) if s.post_norms else None
        self.ffn_norm = _norm(s)
        wide = s.mlp * 2 if s.double_wide_mlp and self.kv_shared else None
        self.feed_forward = MixtureOfExperts(s) if s.has_experts(layer) else FeedForward(s, wide)
        self.ffn_post_norm = _norm(s) if s.post_norms else None
        self.per_layer = PerLayerInput(s) if s.per_layer_input else None
        if s.per_layer_input:
            self.register_buffer("layer_index", torch.tensor([layer]), persistent=False)

    def rope(self, *rope: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The (cos, sin) this layer turns by, of the decoder's (cos, sin[, cos_global, sin_global])."""
        return (rope[2], rope[3]) if self.global_rope_table else (rope[0], rope[1])

    def forward(
        self,
        x: torch.Tensor,
        *rope: torch.Tensor | None,
        kv: tuple[torch.Tensor, torch.Tensor] | None = None,
        shared_kv: tuple[torch.Tensor | None, ...] | None = None,
        per_layer: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`rope`: the decoder's (cos, sin[, cos_global, sin_global]); `kv`: this layer's own keys
        and values, computed before it (a donor's); `shared_kv`: the donors' (local keys, values,
        global keys, values), of which a KV-shared layer reads its kind's; `per_layer`: every
        layer's per-layer input, [batch, seq, layers, per_layer_input]."""
        cos, sin = self.rope(*rope, None, None)
        if self.kv_shared and shared_kv is not None:
            kv = cast(tuple[torch.Tensor, torch.Tensor], shared_kv[2:] if self.attention.is_global else shared_kv[:2])
        attended = self.attention(self.attention_norm(x), cos, sin, *((kv,) if kv is not None else ()))
        if self.attention_post_norm is not None:
            attended = self.attention_post_norm(attended)
        # GPT-NeoX's parallel residual: the MLP reads the block's input, not the attention's sum.
        mlp_input = x if self.parallel else x + attended
        fed = self.feed_forward(self.ffn_norm(mlp_input))
        if self.ffn_post_norm is not None:
            fed = self.ffn_post_norm(fed)
        out = x + attended + fed
        if self.per_layer is not None and per_layer is not None:
            # index_select by a buffer (not a Python int) so that one scanned block serves every layer
            mine = per_layer.index_select(2, self.layer_index.long()).squeeze(2)
            out = out + self.per_layer(out, mine)
        return out


class LayerGroup(nn.Module):
    """One repeat of a layer pattern (Gemma 3's 5 local layers and 1 global, say): the unit the
    planner scans, as MaxText scans its pattern blocks."""

    def __init__(self, s: DecoderShape, first: int, period: int) -> None:
        super().__init__()
        self.members = nn.ModuleList(Block(s, first + i) for i in range(period))

    def forward(self, x: torch.Tensor, *rope: torch.Tensor | None, **inputs: Any) -> torch.Tensor:
        for block in self.members:
            x = block(x, *rope, **inputs)
        return x


class Decoder(nn.Module):
    """A decoder-only transformer of `shape` (token ids in, logits out).

    Its layers are `layers`, a ModuleList of like units the planner scans: the blocks themselves
    for a uniform model, or `LayerGroup`s of a layer pattern; layers outside the repeats (a
    leading run of dense layers, a partial pattern at the end) are `leading` and `trailing`
    (DecoderShape.layer_groups)."""

    scanned_blocks = "layers"  # model/workloads/blocks.py: the stack the planner scans, when there are several
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
        # With KV-shared layers the scanned stack is theirs: the donors' keys and values enter every
        # step of the scan as inputs, and the layers before them run unrolled (`leading`).
        first = shape.layers - shape.kv_shared_layers if shape.kv_shared_layers else 0
        leading, period, groups = shape.layer_groups(first)
        leading += first
        repeated = range(leading, leading + period * groups, period)
        self.layers = nn.ModuleList(Block(shape, i) if period == 1 else LayerGroup(shape, i, period) for i in repeated)
        self.leading = nn.ModuleList(Block(shape, i) for i in range(leading)) if leading else None
        rest = range(leading + period * groups, shape.layers)
        self.trailing = nn.ModuleList(Block(shape, i) for i in rest) if len(rest) else None
        if shape.per_layer_input:  # Gemma 3n / 4: every layer's own input, from the tokens and the embeddings
            width = shape.layers * shape.per_layer_input
            self.per_layer_embeddings = nn.Embedding(shape.per_layer_vocab or shape.vocab, width)
            self.per_layer_projection = nn.Linear(shape.d_model, width, bias=False)
            self.per_layer_norm = RMSNorm(shape.per_layer_input, shape.norm_eps)
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
        computes the head's logits a tile of tokens at a time: planner/compiler/vocab_tiling.py)."""
        seq = tokens.shape[1]
        x = self.tok_embeddings(tokens)
        rope: tuple[torch.Tensor | None, ...] = (None, None)
        if self.pos_embeddings is not None:
            x = x + self.pos_embeddings(torch.arange(seq, device=tokens.device))
        else:
            rope = (self.rope_cos[:seq], self.rope_sin[:seq])
            if hasattr(self, "rope_cos_global"):
                rope += (self.rope_cos_global[:seq], self.rope_sin_global[:seq])
        inputs: dict[str, Any] = {}  # the blocks' inputs besides the residual and the rotary tables
        if self.shape.per_layer_input:
            inputs["per_layer"] = self._per_layer_inputs(tokens, x)
        shared_kv: list[torch.Tensor | None] = [None] * 4  # the donors' (local keys, values, global keys, values)
        for stack in (self.leading, self.layers, self.trailing):
            for layer in stack or ():
                if isinstance(layer, Block) and layer.kv_donor:
                    # The donor's keys and values, computed here so that the shared layers can read them.
                    attention = cast(Attention, layer.attention)  # not latent attention (shape_checks)
                    kv = attention.key_values(layer.attention_norm(x), *layer.rope(*rope, None, None))
                    shared_kv[2 * attention.is_global : 2 * attention.is_global + 2] = kv
                    x = layer(x, *rope, kv=kv, **inputs)
                elif self.shape.kv_shared_layers and (stack is not self.leading or cast(Block, layer).kv_shared):
                    x = layer(x, *rope, shared_kv=tuple(shared_kv), **inputs)
                else:
                    x = layer(x, *rope, **inputs)
        return self.norm(x)

    def _per_layer_inputs(self, tokens: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        """[batch, seq, layers, per_layer_input]: the per-layer table's rows of the tokens and the
        projected embeddings, normed per layer, averaged (transformers' get_per_layer_inputs and
        project_per_layer_inputs; their scales do no matmul)."""
        s = self.shape
        rows = s.per_layer_vocab or s.vocab
        if rows < s.vocab:  # tokens past the per-layer table read its row 0 (Gemma 3n's mask)
            tokens = torch.where(tokens < rows, tokens, torch.zeros_like(tokens))
        split = (*tokens.shape, s.layers, s.per_layer_input)
        identity = self.per_layer_embeddings(tokens).view(split) * s.per_layer_input**0.5
        context = self.per_layer_norm((self.per_layer_projection(embedded) * s.d_model**-0.5).view(split))
        return (identity + context) * 2**-0.5


def attention_spans(shape: DecoderShape) -> tuple[AttentionSpan, ...]:
    """Every layer's attention as the FLOPs formula reads it (metrics/flops.py)."""
    spans = []
    for layer in range(shape.layers):
        heads, kv_heads, head_dim = shape.attention_heads(layer)
        window, chunk = shape.attention_span(layer)
        if shape.kv_shared_layers:  # layers differ in their K/V projections and MLP width too (Gemma 4)
            shared = shape.is_kv_shared(layer)
            wide = 2 if shared and shape.double_wide_mlp else 1
            spans.append(AttentionSpan(heads, head_dim, window, chunk, 0 if shared else kv_heads, shape.mlp * wide))
        else:
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
            "spans": attention_spans(shape) if shape.has_local_layers or shape.kv_shared_layers else (),
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
