"""A generic decoder-only transformer built from a shape: what `tpu-tune plan shape.toml` plans.

A model shape in a small TOML file (or inline: ``decoder:d_model=4096,layers=32,heads=32``), no
model code: Llama-style (gated SiLU MLP, RMSNorm, rotary positions, grouped-query attention) by
default, GPT-3-style with ``gated = false``, ``activation = "gelu"``, ``norm = "layer"``,
``positions = "learned"``, ``tied_embeddings = true``. The module names are Llama's
(``wq``/``wk``/``wv``/``wo``, ``w_gate``/``w_up``/``w_down``): the planner places weights by
structure, and a user's own file (examples/llama.py) stays the example of a model of one's own.

```toml
[model]
vocab = 50257
d_model = 12288
layers = 96
heads = 96
kv_heads = 96          # default: heads (no grouped-query attention)
head_dim = 128         # default: d_model / heads
mlp = 49152            # the MLP's hidden width
gated = false          # default true (SwiGLU-style: gate and up projections)
activation = "gelu"    # silu (default), gelu, relu
norm = "layer"         # rms (default), layer
positions = "learned"  # rope (default), learned
tied_embeddings = true # default false
max_seq_len = 2048     # default 8192
experts = 8            # default 0 (dense): a mixture of `experts` MLPs of width mlp in every block
top_k = 2              # experts per token (default 2)
capacity_factor = 1.25 # expert slots per sequence: ceil(seq x top_k / experts) x this (default 1.25)

[run]                  # optional: the step's default sizes (--global-batch / --seq override them)
batch_size = 8
seq_len = 2048
```
"""

from __future__ import annotations

import math

import tomllib
import types
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tpu_tuner.core.errors import WorkloadError

INLINE_PREFIX = "decoder:"
ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}
NORMS = ("rms", "layer")
POSITIONS = ("rope", "learned")


@dataclass(frozen=True)
class DecoderShape:
    """Everything that sizes a decoder-only transformer."""

    vocab: int
    d_model: int
    layers: int
    heads: int
    mlp: int
    kv_heads: int | None = None
    head_dim: int | None = None
    gated: bool = True
    activation: str = "silu"
    norm: str = "rms"
    positions: str = "rope"
    tied_embeddings: bool = False
    max_seq_len: int = 8192
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    experts: int = 0  # a mixture of experts in every block when > 0 (each expert an MLP of width `mlp`)
    top_k: int = 2  # experts per token
    capacity_factor: float = 1.25  # expert slots per sequence: ceil(seq x top_k / experts) x this

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def n_head_dim(self) -> int:
        return self.head_dim or self.d_model // self.heads

    def check(self, where: str | Path) -> None:
        """A one-line WorkloadError naming `where` for a shape no decoder has."""
        for name in ("vocab", "d_model", "layers", "heads", "mlp", "max_seq_len"):
            if getattr(self, name) < 1:
                raise WorkloadError(f"{name} must be at least 1, not {getattr(self, name)}", where)
        if self.experts < 0 or (self.experts and not 1 <= self.top_k <= self.experts):
            raise WorkloadError(f"top_k ({self.top_k}) must be between 1 and experts ({self.experts})", where)
        if self.experts and self.capacity_factor <= 0:
            raise WorkloadError(f"capacity_factor must be above 0, not {self.capacity_factor}", where)
        if self.heads % self.n_kv_heads:
            raise WorkloadError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.n_kv_heads})", where)
        if self.head_dim is None and self.d_model % self.heads:
            raise WorkloadError(f"d_model ({self.d_model}) is not a multiple of heads ({self.heads}): give head_dim",
                                where)
        if self.positions == "rope" and self.n_head_dim % 2:
            raise WorkloadError(f"rotary positions need an even head_dim, not {self.n_head_dim}", where)
        for name, allowed in (("activation", tuple(ACTIVATIONS)), ("norm", NORMS), ("positions", POSITIONS)):
            if getattr(self, name) not in allowed:
                raise WorkloadError(f"{name} must be one of {', '.join(allowed)}, not {getattr(self, name)!r}", where)


def _norm(shape: DecoderShape) -> nn.Module:
    return RMSNorm(shape.d_model, shape.norm_eps) if shape.norm == "rms" else nn.LayerNorm(shape.d_model, shape.norm_eps)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    def __init__(self, s: DecoderShape) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.rope = s.heads, s.n_kv_heads, s.n_head_dim, s.positions == "rope"
        self.wq = nn.Linear(s.d_model, s.heads * self.head_dim, bias=False)
        self.wk = nn.Linear(s.d_model, s.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(s.d_model, s.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(s.heads * self.head_dim, s.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.wq(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.rope:
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        repeat = self.heads // self.kv_heads  # grouped-query attention: each K/V head serves `repeat`
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim))


class FeedForward(nn.Module):
    def __init__(self, s: DecoderShape) -> None:
        super().__init__()
        self.activation = ACTIVATIONS[s.activation]
        self.w_gate = nn.Linear(s.d_model, s.mlp, bias=False) if s.gated else None
        self.w_up = nn.Linear(s.d_model, s.mlp, bias=False)
        self.w_down = nn.Linear(s.mlp, s.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w_gate is not None:
            return self.w_down(self.activation(self.w_gate(x)) * self.w_up(x))
        return self.w_down(self.activation(self.w_up(x)))


class MixtureOfExperts(nn.Module):
    """Top-k routed experts with a capacity per sequence, tokens past it dropped: MaxText's
    "dropping" MoE (Mixtral's published v6e-256 run). The router's top-k logits, softmaxed
    among themselves, weight the chosen experts; each sequence gives every expert
    ceil(seq x top_k / experts) x capacity_factor slots, filled in token order; dispatch and
    combine are one-hot einsums over [batch, seq, experts, slots], as MaxText computes them.

    `n_experts` and `top_k` are read by the model-FLOPs count (only top_k of n_experts experts'
    weights touch each token)."""

    def __init__(self, s: DecoderShape) -> None:
        super().__init__()
        self.n_experts, self.top_k, self.capacity_factor = s.experts, s.top_k, s.capacity_factor
        self.activation = ACTIVATIONS[s.activation]
        self.router = nn.Linear(s.d_model, s.experts, bias=False)
        scale = s.d_model ** -0.5
        self.w_gate = nn.Parameter(torch.randn(s.experts, s.d_model, s.mlp) * scale) if s.gated else None
        self.w_up = nn.Parameter(torch.randn(s.experts, s.d_model, s.mlp) * scale)
        self.w_down = nn.Parameter(torch.randn(s.experts, s.mlp, s.d_model) * s.mlp ** -0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        weights, chosen = self.router(x).topk(self.top_k, dim=-1)  # [batch, seq, k]
        weights = weights.float().softmax(dim=-1).to(x.dtype)
        capacity = int(max(math.ceil(seq * self.top_k / self.n_experts) * self.capacity_factor, self.capacity_factor))
        routed = F.one_hot(chosen, self.n_experts).to(torch.int32)  # [batch, seq, k, experts]
        # 1-based place of each (token, choice) in its expert's slots, in token order; 0: not routed.
        place = (routed.reshape(batch, seq * self.top_k, -1).cumsum(dim=1).reshape(routed.shape) * routed)
        slots = torch.arange(1, capacity + 1, device=x.device, dtype=torch.int32)
        combine = ((place[..., None] == slots) * weights[..., None, None]).sum(dim=2)  # [batch, seq, experts, slots]
        dispatch = (combine != 0).to(x.dtype)
        expert_in = torch.einsum("bsm,bsec->ebcm", x, dispatch)
        hidden = torch.einsum("ebcm,emh->ebch", expert_in, self.w_up.to(x.dtype))
        if self.w_gate is not None:
            hidden = self.activation(torch.einsum("ebcm,emh->ebch", expert_in, self.w_gate.to(x.dtype))) * hidden
        else:
            hidden = self.activation(hidden)
        out = torch.einsum("ebch,ehm->ebcm", hidden, self.w_down.to(x.dtype))
        return torch.einsum("ebcm,bsec->bsm", out, combine.to(x.dtype))


class Block(nn.Module):
    def __init__(self, s: DecoderShape) -> None:
        super().__init__()
        self.attention_norm = _norm(s)
        self.attention = Attention(s)
        self.ffn_norm = _norm(s)
        self.feed_forward = MixtureOfExperts(s) if s.experts else FeedForward(s)

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Decoder(nn.Module):
    """A decoder-only transformer of `shape` (token ids in, logits out)."""

    def __init__(self, shape: DecoderShape) -> None:
        super().__init__()
        self.shape = shape
        self.tok_embeddings = nn.Embedding(shape.vocab, shape.d_model)
        self.pos_embeddings = nn.Embedding(shape.max_seq_len, shape.d_model) if shape.positions == "learned" else None
        self.layers = nn.ModuleList(Block(shape) for _ in range(shape.layers))
        self.norm = _norm(shape)
        self.output = nn.Linear(shape.d_model, shape.vocab, bias=False)
        if shape.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight
        if shape.positions == "rope":
            head_dim = shape.n_head_dim
            inv_freq = 1.0 / (shape.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
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


def is_shape_source(path: str | Path) -> bool:
    """Whether `path` names a decoder shape (a .toml file, or an inline ``decoder:...`` spec)."""
    text = str(path)
    return text.startswith(INLINE_PREFIX) or text.endswith(".toml")


def read_shape(path: str | Path) -> tuple[DecoderShape, dict[str, int], str]:
    """The shape, the run sizes ([run]) and a name, from a TOML file or an inline spec."""
    text = str(path)
    if text.startswith(INLINE_PREFIX):
        model: dict[str, Any] = {}
        for item in filter(None, text[len(INLINE_PREFIX):].split(",")):
            key, sep, value = item.partition("=")
            if not sep:
                raise WorkloadError(f"{item!r} is not key=value", text)
            model[key.strip()] = _value(value.strip())
        run: dict[str, Any] = {}
        name = "decoder"
    else:
        file = Path(path)
        if not file.is_file():
            raise WorkloadError("file not found", file)
        try:
            data = tomllib.loads(file.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise WorkloadError(f"not valid TOML: {exc}", file) from exc
        model, run, name = data.get("model", {}), data.get("run", {}), file.stem
        if not isinstance(model, dict) or not model:
            raise WorkloadError("no [model] table with the decoder's shape (d_model, layers, heads, ...)", file)
    known = {f.name for f in fields(DecoderShape)}
    unknown = sorted(set(model) - known)
    if unknown:
        raise WorkloadError(f"unknown shape key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}", path)
    try:
        shape = DecoderShape(**model)
    except TypeError as exc:
        raise WorkloadError(f"incomplete shape: {exc}", path) from exc
    shape.check(path)
    sizes = {k: int(v) for k, v in run.items() if k in ("batch_size", "seq_len")}
    return shape, sizes, name


def _value(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def shape_module(path: str | Path) -> types.ModuleType:
    """A module with the native contract (build_model, make_batch, loss, BATCH_SIZE, SEQ_LEN,
    TRANSFORMER) for the shape at `path`: the loader reads it as it reads a user's file."""
    shape, sizes, name = read_shape(path)
    module = types.ModuleType(f"tpu_tune_decoder_{name}")

    def build_model() -> nn.Module:
        return Decoder(shape)

    def make_batch(batch_size: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, shape.vocab, (batch_size, seq_len + 1))
        return tokens[:, :-1], tokens[:, 1:]

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))

    module.build_model, module.make_batch, module.loss = build_model, make_batch, loss  # type: ignore[attr-defined]
    module.BATCH_SIZE = sizes.get("batch_size", 1)  # type: ignore[attr-defined]
    module.SEQ_LEN = sizes.get("seq_len", min(2048, shape.max_seq_len))  # type: ignore[attr-defined]
    module.TRANSFORMER = {"layers": shape.layers, "heads": shape.heads,  # type: ignore[attr-defined]
                          "head_dim": shape.n_head_dim, "causal": True}
    module.NAME = name  # type: ignore[attr-defined]
    return module


__all__ = ["Decoder", "DecoderShape", "is_shape_source", "read_shape", "shape_module"]
