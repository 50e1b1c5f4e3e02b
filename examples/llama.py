"""A Llama-style decoder (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU MLP) whose
size is a parameter, trained one step at a time (native tpu-tune contract).

Presets: "tiny" (the default, runs on a laptop CPU), "8b" and "70b" (the published Llama-3.1
shapes), and MaxText's synthetic "16b", "32b" and "128b" scales (for the planner's calibration).
Run: tpu-tune profile examples/llama.py        (tiny)
     tpu-tune plan examples/llama.py --preset 70b --topology v5p-256
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    mlp_hidden: int
    max_seq_len: int = 8192
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


PRESETS: dict[str, LlamaConfig] = {
    "tiny": LlamaConfig(
        vocab_size=4096, d_model=256, n_layers=4, n_heads=8, n_kv_heads=2, mlp_hidden=768, max_seq_len=1024
    ),
    "8b": LlamaConfig(vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, mlp_hidden=14336),
    "70b": LlamaConfig(vocab_size=128256, d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, mlp_hidden=28672),
    # MaxText synthetic global_parameter_scale models: MHA, head_dim 128, vocab 32000.
    "16b": LlamaConfig(
        vocab_size=32000, d_model=4096, n_layers=32, n_heads=64, n_kv_heads=64, mlp_hidden=28672, max_seq_len=2048
    ),
    "32b": LlamaConfig(
        vocab_size=32000, d_model=8192, n_layers=32, n_heads=64, n_kv_heads=64, mlp_hidden=28672, max_seq_len=2048
    ),
    "128b": LlamaConfig(
        vocab_size=32000, d_model=8192, n_layers=64, n_heads=128, n_kv_heads=128, mlp_hidden=57344, max_seq_len=2048
    ),
}
# MaxText's synthetic scales fix head_dim at 128 whatever d_model / heads is (it decouples them).
HEAD_DIM_OVERRIDE = {"16b": 128, "32b": 128, "128b": 128}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig, head_dim: int) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, head_dim
        self.wq = nn.Linear(c.d_model, c.n_heads * head_dim, bias=False)
        self.wk = nn.Linear(c.d_model, c.n_kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(c.d_model, c.n_kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(c.n_heads * head_dim, c.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.wq(x).view(batch, seq, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(batch, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(batch, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        repeat = self.n_heads // self.n_kv_heads  # grouped-query attention: share each K/V head
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(batch, seq, self.n_heads * self.head_dim))


class FeedForward(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.w_gate = nn.Linear(c.d_model, c.mlp_hidden, bias=False)
        self.w_up = nn.Linear(c.d_model, c.mlp_hidden, bias=False)
        self.w_down = nn.Linear(c.mlp_hidden, c.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, c: LlamaConfig, head_dim: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(c.d_model, c.norm_eps)
        self.attention = Attention(c, head_dim)
        self.ffn_norm = RMSNorm(c.d_model, c.norm_eps)
        self.feed_forward = FeedForward(c)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, c: LlamaConfig, head_dim: int | None = None) -> None:
        super().__init__()
        self.config = c
        head_dim = head_dim or c.head_dim
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.d_model)
        self.layers = nn.ModuleList(Block(c, head_dim) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.d_model, c.norm_eps)
        self.output = nn.Linear(c.d_model, c.vocab_size, bias=False)
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = torch.outer(torch.arange(c.max_seq_len, dtype=torch.float32), inv_freq)
        self.register_buffer("rope_cos", angles.cos(), persistent=False)
        self.register_buffer("rope_sin", angles.sin(), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.output(self.norm(x))


# --- the tpu-tune contract ------------------------------------------------------------------
PRESET = "tiny"
BATCH_SIZE = 4
SEQ_LEN = 256


def _dims(preset: str) -> tuple[LlamaConfig, int]:
    config = PRESETS[preset]
    return config, HEAD_DIM_OVERRIDE.get(preset, config.head_dim)


def build_model(preset: str | None = None) -> nn.Module:
    config, head_dim = _dims(preset or PRESET)
    return Llama(config, head_dim)


def transformer_dims(preset: str | None = None) -> dict:
    config, head_dim = _dims(preset or PRESET)
    return {"layers": config.n_layers, "heads": config.n_heads, "head_dim": head_dim, "causal": True}


TRANSFORMER = transformer_dims()


def make_batch(batch_size: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, PRESETS[PRESET].vocab_size, (batch_size, seq_len + 1))
    return tokens[:, :-1], tokens[:, 1:]


def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))
