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
import torch
import torch.nn.functional as F
from torch import nn

from tpu_tuner.model.decoder_shape import INLINE_PREFIX, DecoderShape, is_shape_source, read_shape
from tpu_tuner.model.experts import MixtureOfExperts
from tpu_tuner.model.latent_attention import LatentAttention
from tpu_tuner.model.layer_parts import FeedForward, RMSNorm, rotate as _rotate


def _norm(shape: DecoderShape) -> nn.Module:
    # nn.LayerNorm carries a bias, as GPT-2's and GPT-NeoX's do.
    return RMSNorm(shape.d_model, shape.norm_eps) if shape.norm == "rms" else nn.LayerNorm(shape.d_model, shape.norm_eps)


class Attention(nn.Module):
    def __init__(self, s: DecoderShape) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.rope = s.heads, s.n_kv_heads, s.n_head_dim, s.positions == "rope"
        self.wq = nn.Linear(s.d_model, s.heads * self.head_dim, bias=s.qkv_bias)
        self.wk = nn.Linear(s.d_model, s.n_kv_heads * self.head_dim, bias=s.qkv_bias)
        self.wv = nn.Linear(s.d_model, s.n_kv_heads * self.head_dim, bias=s.qkv_bias)
        self.wo = nn.Linear(s.heads * self.head_dim, s.d_model, bias=s.out_bias)
        self.q_norm = RMSNorm(self.head_dim, s.norm_eps) if s.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, s.norm_eps) if s.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.wq(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        repeat = self.heads // self.kv_heads  # grouped-query attention: each K/V head serves `repeat`
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim))


class Block(nn.Module):
    def __init__(self, s: DecoderShape, layer: int = 0) -> None:
        super().__init__()
        self.parallel = s.parallel_residual
        self.attention_norm = _norm(s)
        self.attention = LatentAttention(s) if s.kv_lora_rank else Attention(s)
        self.attention_post_norm = _norm(s) if s.post_norms else None
        self.ffn_norm = _norm(s)
        self.feed_forward = MixtureOfExperts(s) if s.has_experts(layer) else FeedForward(s)
        self.ffn_post_norm = _norm(s) if s.post_norms else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
        attended = self.attention(self.attention_norm(x), cos, sin)
        if self.attention_post_norm is not None:
            attended = self.attention_post_norm(attended)
        # GPT-NeoX's parallel residual: the MLP reads the block's input, not the attention's sum.
        mlp_input = x if self.parallel else x + attended
        fed = self.feed_forward(self.ffn_norm(mlp_input))
        if self.ffn_post_norm is not None:
            fed = self.ffn_post_norm(fed)
        return x + attended + fed


class Decoder(nn.Module):
    """A decoder-only transformer of `shape` (token ids in, logits out)."""

    def __init__(self, shape: DecoderShape) -> None:
        super().__init__()
        self.shape = shape
        self.tok_embeddings = nn.Embedding(shape.vocab, shape.d_model)
        self.pos_embeddings = nn.Embedding(shape.max_seq_len, shape.d_model) if shape.positions == "learned" else None
        self.layers = nn.ModuleList(Block(shape, layer) for layer in range(shape.layers))
        self.norm = _norm(shape)
        self.output = nn.Linear(shape.d_model, shape.vocab, bias=False)
        if shape.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight
        if shape.positions == "rope":
            rotated = shape.rotary_dim
            inv_freq = 1.0 / (shape.rope_theta ** (torch.arange(0, rotated, 2, dtype=torch.float32) / rotated))
            angles = torch.outer(torch.arange(shape.max_seq_len, dtype=torch.float32), inv_freq)
            self.register_buffer("rope_cos", angles.cos(), persistent=False)
            self.register_buffer("rope_sin", angles.sin(), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        x = self.tok_embeddings(tokens)
        cos = sin = None
        if self.pos_embeddings is not None:
            x = x + self.pos_embeddings(torch.arange(seq, device=tokens.device))
        else:
            cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.output(self.norm(x))


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

    module.build_model, module.make_batch, module.loss = build_model, make_batch, loss  # type: ignore[attr-defined]
    module.BATCH_SIZE, module.SEQ_LEN = batch_size, seq_len  # type: ignore[attr-defined]
    module.TRANSFORMER = {"layers": shape.layers, "heads": shape.heads,  # type: ignore[attr-defined]
                          "head_dim": shape.n_head_dim, "causal": True,
                          **({"value_head_dim": shape.v_head_dim} if shape.kv_lora_rank else {})}
    module.NAME = name  # type: ignore[attr-defined]
    module.SHAPE = shape  # type: ignore[attr-defined]
    return module


__all__ = ["Decoder", "DecoderShape", "INLINE_PREFIX", "decoder_module", "is_shape_source", "read_shape",
           "shape_module"]
