"""A small transformer encoder whose inputs vary in length (native tpu-tune contract).

Serving-style inference: each request is a token sequence of its own length; the model embeds it,
runs 4 pre-norm encoder layers (d_model 256, 4 heads) under a padding mask, mean-pools the valid
tokens and classifies. About 5M parameters. `sample_lengths()` gives a realistic, skewed request
length distribution (log-normal, median ~110 tokens, a long tail to 1024), the input of
`tpu-tune buckets`:

    tpu-tune buckets examples/encoder.py
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 8192
D_MODEL = 256
HEADS = 4
LAYERS = 4
CLASSES = 16
MAX_LEN = 1024

BATCH_SIZE = 16
SEQ_LEN = 128  # the length `tpu-tune profile` uses; `buckets` uses sample_lengths()
TRANSFORMER = {"layers": LAYERS, "heads": HEADS, "head_dim": D_MODEL // HEADS, "causal": False}


class EncoderLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.n_heads = HEADS
        self.norm1 = nn.LayerNorm(D_MODEL)
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.proj = nn.Linear(D_MODEL, D_MODEL)
        self.norm2 = nn.LayerNorm(D_MODEL)
        self.up = nn.Linear(D_MODEL, 4 * D_MODEL)
        self.down = nn.Linear(4 * D_MODEL, D_MODEL)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, seq, self.n_heads, width // self.n_heads).transpose(1, 2) for t in (q, k, v))
        # keep: [batch, 1, 1, seq], True where a key is a real token (padding keys are masked out).
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, width))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.position = nn.Embedding(MAX_LEN, D_MODEL)
        self.layers = nn.ModuleList(EncoderLayer() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(D_MODEL)
        self.classify = nn.Linear(D_MODEL, CLASSES)

    def forward(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if attention_mask is None:
            attention_mask = torch.ones_like(tokens, dtype=torch.bool)
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        keep = attention_mask[:, None, None, :]
        for layer in self.layers:
            x = layer(x, keep)
        valid = attention_mask.unsqueeze(-1).to(x.dtype)
        pooled = (self.norm(x) * valid).sum(1) / valid.sum(1).clamp(min=1.0)
        return self.classify(pooled)


def build_model() -> nn.Module:
    return Encoder().eval()


def make_batch(batch_size: int, seq_len: int) -> dict[str, torch.Tensor]:
    """A batch of `batch_size` requests, all `seq_len` tokens long (bucketing pads shorter ones)."""
    return {
        "tokens": torch.randint(0, VOCAB, (batch_size, seq_len)),
        "attention_mask": torch.ones(batch_size, seq_len, dtype=torch.bool),
    }


def sample_lengths() -> list[int]:
    """10,000 request lengths: log-normal (median 110 tokens, sigma 0.75), clipped to [4, 1024]."""
    rng = np.random.default_rng(0)
    lengths = np.exp(rng.normal(np.log(110.0), 0.75, size=10_000))
    return np.clip(np.round(lengths), 4, MAX_LEN).astype(int).tolist()
