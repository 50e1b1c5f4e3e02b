"""Pieces the generic decoder's attention and feed-forward modules share: the activations, RMSNorm,
the rotary turn and the dense MLP. They live here, below model/decoders/decoder.py, so that the attention and
expert modules (model/decoders/latent_attention.py, model/decoders/experts.py) can use them without importing the
decoder that chooses among them."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from tpu_tuner.model.decoders.decoder_shape import DecoderShape

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
}


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """gpt-oss's gated activation: the gate clipped above at `limit`, the up projection to
    [-limit, limit], then (up + 1) x gate x sigmoid(alpha x gate) (transformers'
    GptOssExperts._apply_gate; MaxText's RoutedMoE.apply_ffn_activation for the gpt_oss block)."""
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def gated_activation(s: DecoderShape) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """How a gated MLP of shape `s` joins its gate and up projections: activation(gate) x up, or
    gpt-oss's clamped SwiGLU. Elementwise either way: no matmul FLOPs."""
    if s.activation == "clamped_swiglu":
        return partial(clamped_swiglu, alpha=s.swiglu_alpha, limit=s.swiglu_limit)
    return partial(_gate_times_up, activation=ACTIVATIONS[s.activation])  # a partial pickles, a lambda not


def _gate_times_up(
    gate: torch.Tensor, up: torch.Tensor, activation: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    return activation(gate) * up


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale, computed in float32 as Llama's is."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding of `x`'s first 2 x cos.shape[-1] dimensions (half-split pairs)."""
    rotated = 2 * cos.shape[-1]  # partial rotary: the dimensions past it pass unturned
    half = rotated // 2
    x1, x2, rest = x[..., :half], x[..., half:rotated], x[..., rotated:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


class FeedForward(nn.Module):
    """The dense MLP (gated SwiGLU-style by default) of hidden width `width` (default: the shape's mlp)."""

    def __init__(self, s: DecoderShape, width: int | None = None) -> None:
        super().__init__()
        width = width or s.mlp
        # clamped_swiglu is gated only (DecoderShape.check): a plain MLP has one of ACTIVATIONS.
        # gated: activation(gate, up); plain: activation(up)
        self.activation: Callable[..., torch.Tensor] = gated_activation(s) if s.gated else ACTIVATIONS[s.activation]
        self.w_gate = nn.Linear(s.d_model, width, bias=s.mlp_bias) if s.gated else None
        self.w_up = nn.Linear(s.d_model, width, bias=s.mlp_bias)
        self.w_down = nn.Linear(width, s.d_model, bias=s.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w_gate is not None:
            return self.w_down(self.activation(self.w_gate(x), self.w_up(x)))
        return self.w_down(self.activation(self.w_up(x)))


__all__ = ["ACTIVATIONS", "FeedForward", "RMSNorm", "clamped_swiglu", "gated_activation", "rotate"]
