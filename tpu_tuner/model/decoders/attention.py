"""The generic decoder's attention, as each layer of today's models defines it.

A global layer is causal attention over the whole sequence (`F.scaled_dot_product_attention`, which
the planner compiles as TPU flash attention). A local layer attends through a sliding window
(Mistral v0.1, Gemma 2/3, gpt-oss) or causally within fixed chunks (Llama 4), and a layer may add
attention sinks (gpt-oss: a learned logit per head that joins the softmax's denominator). Those go
through one torch operator of the package's own, ``torch.ops.tpu_tune.local_attention``: plain
masked attention on CPU and GPU, and an operator the planner replaces with Pallas splash attention
and its block-sparse local or chunked mask (planner/compiler/step_parts.py), so a compiled local layer costs
its window, not the sequence. The operator's backward is an operator too, so the FLOP counter
(metrics/flops.py) counts both passes by the mask's size, as it counts global attention.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tpu_tuner.model.decoders.decoder_shape import DecoderShape
from tpu_tuner.model.decoders.layer_parts import RMSNorm, rotate


def attention_mask(seq: int, window: int, chunk: int, device: torch.device | str | None = None) -> torch.Tensor:
    """[seq, seq] booleans, True where query i may attend to key j: causal, within `window` tokens
    (itself included) when `window`, within the same `chunk` when `chunk`."""
    query = torch.arange(seq, device=device)[:, None]
    key = torch.arange(seq, device=device)[None, :]
    allowed = key <= query
    if window:
        allowed = allowed & (query - key < window)
    if chunk:
        allowed = allowed & (query // chunk == key // chunk)
    return allowed


def _accumulate(tensor: torch.Tensor) -> torch.dtype:
    return torch.promote_types(tensor.dtype, torch.float32)  # fp32 scores for bf16, fp64 kept for gradcheck


def _scores(query: torch.Tensor, key: torch.Tensor, window: int, chunk: int) -> torch.Tensor:
    scores = (query @ key.transpose(-1, -2)).to(_accumulate(query)) * query.shape[-1] ** -0.5
    mask = attention_mask(query.shape[-2], window, chunk, query.device)
    return scores.masked_fill(~mask, float("-inf"))


def _probabilities(scores: torch.Tensor, sinks: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The softmax over the keys and, with sinks, each sink's share of the denominator."""
    if sinks is None:
        return scores.softmax(dim=-1), None
    sink = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    both = torch.cat([scores, sink], dim=-1).softmax(dim=-1)
    return both[..., :-1], both[..., -1]


def _reference(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, sinks: torch.Tensor | None, window: int, chunk: int
) -> torch.Tensor:
    probabilities, _ = _probabilities(_scores(query, key, window, chunk), sinks)
    return probabilities.to(value.dtype) @ value


@torch.library.custom_op("tpu_tune::local_attention", mutates_args=())
def local_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, sinks: torch.Tensor | None, window: int, chunk: int
) -> torch.Tensor:
    """Causal attention of [batch, heads, seq, head_dim] query / key / value through a window or
    in chunks (`window` or `chunk`; 0: neither), with `sinks` (one logit per head) or None."""
    return _reference(query, key, value, sinks, window, chunk)


@local_attention.register_fake
def _local_attention_fake(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, sinks: torch.Tensor | None, window: int, chunk: int
) -> torch.Tensor:
    return query.new_empty(*query.shape[:-1], value.shape[-1])


@torch.library.custom_op("tpu_tune::local_attention_backward", mutates_args=())
def local_attention_backward(
    grad: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    sinks: torch.Tensor | None,
    window: int,
    chunk: int,
) -> list[torch.Tensor]:
    """The gradients of `local_attention` (query, key, value, then sinks when given)."""
    # Softmax attention's gradients in closed form (masked pairs have probability 0 and get none):
    # dS = P * (dO V^T - rowsum(dO * O)); a sink's logit gets -p_sink * rowsum(dO * O).
    probabilities, sink_share = _probabilities(_scores(query, key, window, chunk), sinks)
    acc = _accumulate(query)
    grad32, value32 = grad.to(acc), value.to(acc)
    output = probabilities @ value32
    row = (grad32 * output).sum(dim=-1, keepdim=True)
    d_scores = probabilities * (grad32 @ value32.transpose(-1, -2) - row) * query.shape[-1] ** -0.5
    grads = [
        (d_scores @ key.to(acc)).to(query.dtype),
        (d_scores.transpose(-1, -2) @ query.to(acc)).to(key.dtype),
        (probabilities.transpose(-1, -2) @ grad32).to(value.dtype),
    ]
    if sinks is not None and sink_share is not None:
        grads.append((-sink_share * row[..., 0]).sum(dim=(0, 2)).to(sinks.dtype))
    return grads


@local_attention_backward.register_fake
def _local_attention_backward_fake(
    grad: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    sinks: torch.Tensor | None,
    window: int,
    chunk: int,
) -> list[torch.Tensor]:
    grads = [torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)]
    return grads + ([torch.empty_like(sinks)] if sinks is not None else [])


def _save(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    query, key, value, sinks, window, chunk = inputs
    ctx.save_for_backward(query, key, value, sinks)
    ctx.window, ctx.chunk = window, chunk


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    query, key, value, sinks = ctx.saved_tensors
    grads = local_attention_backward(grad, query, key, value, sinks, ctx.window, ctx.chunk)
    return grads[0], grads[1], grads[2], grads[3] if sinks is not None else None, None, None


local_attention.register_autograd(_backward, setup_context=_save)


def local_attention_op() -> torch._ops.OpOverload:
    """The operator as torch dispatches it (what an environment such as torchax overrides)."""
    return torch.ops.tpu_tune.local_attention.default


def local_attention_backward_op() -> torch._ops.OpOverload:
    return torch.ops.tpu_tune.local_attention_backward.default


class Attention(nn.Module):
    """Layer `layer`'s attention of the shape `s`: its heads, head width, window or chunk, sinks.

    `window` and `chunk` are read by the planner's mask and the FLOPs count; `rope` is whether
    this layer turns its queries and keys (Llama 4's global layers do not). A KV-shared layer
    (Gemma 4: model/decoders/shape_checks.py) has no key or value projection: its forward takes another
    layer's keys and values, as that layer's `key_values` gave them."""

    def __init__(self, s: DecoderShape, layer: int = 0) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = s.attention_heads(layer)
        self.window, self.chunk = s.attention_span(layer)
        self.is_global = s.is_global(layer)  # which donor a KV-shared layer reads
        is_global = self.is_global and s.has_local_layers
        self.rope = s.positions == "rope" and not (is_global and not s.global_rope)
        self.kv_shared = s.is_kv_shared(layer)
        self.wq = nn.Linear(s.d_model, self.heads * self.head_dim, bias=s.qkv_bias)
        kv_width = self.kv_heads * self.head_dim
        self.wk = None if self.kv_shared else nn.Linear(s.d_model, kv_width, bias=s.qkv_bias)
        # Gemma 4's global layers: one projection gives the keys, and the values are the same vectors.
        shared_kv = (is_global and s.global_shared_kv) or self.kv_shared
        self.wv = None if shared_kv else nn.Linear(s.d_model, kv_width, bias=s.qkv_bias)
        self.wo = nn.Linear(self.heads * self.head_dim, s.d_model, bias=s.out_bias)
        self.q_norm = RMSNorm(self.head_dim, s.norm_eps) if s.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, s.norm_eps) if s.qk_norm and not self.kv_shared else None
        self.sinks = nn.Parameter(torch.zeros(self.heads)) if s.attention_sinks else None
        if self.kv_shared:  # the planner's checkpoint names (remat.block_tensor_roles) would read wq as qkv
            self.tensor_roles = {"wq": "query_proj", "wo": "out_proj"}

    def key_values(
        self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's keys and values of `x`, [batch, kv_heads, seq, head_dim] each: normed and
        turned, as attention reads them (and as a KV-shared layer reads its donor's)."""
        if self.wk is None:
            raise ValueError("a KV-shared layer projects no keys or values: pass its donor's")
        batch, seq, _ = x.shape
        k = self.wk(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = k if self.wv is None else self.wv(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.k_norm is not None:
            k = self.k_norm(k)
        if self.rope and cos is not None and sin is not None:
            k = rotate(k, cos, sin)
        return k, v

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.wq(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q = self.q_norm(q)
        if self.rope and cos is not None and sin is not None:
            q = rotate(q, cos, sin)
        k, v = kv if kv is not None else self.key_values(x, cos, sin)
        repeat = self.heads // self.kv_heads  # grouped-query attention: each K/V head serves `repeat`
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        if self.window or self.chunk or self.sinks is not None:
            y = local_attention(q, k, v, self.sinks, self.window, self.chunk)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim))


__all__ = [
    "Attention",
    "attention_mask",
    "local_attention",
    "local_attention_backward",
    "local_attention_backward_op",
    "local_attention_op",
]
