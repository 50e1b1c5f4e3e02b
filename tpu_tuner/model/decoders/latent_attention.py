"""Multi-head latent attention (MLA), DeepSeek-V2/V3's (arXiv:2405.04434, section 2.1), as
transformers' deepseek_v3 modeling file and MaxText's layers/attention_mla.py build it.

Keys and values come from one compressed latent per token (``kv_lora_rank`` wide, RMS-normed) that
``wkv_b`` expands into every head's key part without positions (``qk_nope_head_dim``) and value
(``v_head_dim``); the query likewise from a ``q_lora_rank`` latent (or, with q_lora_rank 0, a full
projection). Positions enter through a decoupled rotary part: ``qk_rope_head_dim`` more query
dimensions per head, and one rotary key per token, computed with the latent and shared by every
head. Query and key heads are qk_nope + qk_rope wide, value heads v_head_dim: the attention runs as
F.scaled_dot_product_attention with values of another width than the keys (the planner's flash
kernel pads them: planner/compiler/step_parts.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tpu_tuner.model.decoders.decoder_shape import DecoderShape
from tpu_tuner.model.decoders.layer_parts import RMSNorm, rotate


class LatentAttention(nn.Module):
    """MLA with DeepSeek's module layout: ``wq_a`` / ``q_norm`` / ``wq_b`` (or ``wq``), ``wkv_a``
    (latent and rotary key), ``kv_norm``, ``wkv_b`` (keys without positions and values), ``wo``."""

    # Linears that neither read nor write d_model but split heads: column-wise over tensor, as
    # MaxText shards wq_b and wkv_b (q_lora / kv_lora over fsdp, heads over tensor); see layouts.py.
    column_wise = ("wq_b", "wkv_b")

    @property
    def tensor_roles(self) -> dict[str, str]:
        """MaxText's checkpoint names of this module's projections (planner/compiler/remat.py): the query's
        up-projection, ``wkv_b`` (keys without positions and values, one tensor) as the key's, ``wo``."""
        return {"wq_b" if self.q_latent else "wq": "query_proj", "wkv_b": "key_proj", "wo": "out_proj"}

    def __init__(self, s: DecoderShape) -> None:
        super().__init__()
        self.heads, self.nope, self.rope_dim, self.v_dim = s.heads, s.qk_nope_head_dim, s.qk_rope_head_dim, s.v_head_dim
        self.head_dim = self.nope + self.rope_dim  # the query/key head, what the planner reads as head_dim
        self.kv_lora_rank, self.q_latent = s.kv_lora_rank, s.q_lora_rank > 0
        if self.q_latent:
            self.wq_a = nn.Linear(s.d_model, s.q_lora_rank, bias=s.qkv_bias)
            self.q_norm = RMSNorm(s.q_lora_rank, s.norm_eps)
            self.wq_b = nn.Linear(s.q_lora_rank, s.heads * self.head_dim, bias=False)
        else:
            self.wq = nn.Linear(s.d_model, s.heads * self.head_dim, bias=False)  # unbiased, as DeepSeek's q_proj
        self.wkv_a = nn.Linear(s.d_model, s.kv_lora_rank + self.rope_dim, bias=s.qkv_bias)
        self.kv_norm = RMSNorm(s.kv_lora_rank, s.norm_eps)
        self.wkv_b = nn.Linear(s.kv_lora_rank, s.heads * (self.nope + self.v_dim), bias=False)
        self.wo = nn.Linear(s.heads * self.v_dim, s.d_model, bias=s.out_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
        assert cos is not None and sin is not None  # latent attention needs rotary positions (DecoderShape.check)
        batch, seq, _ = x.shape
        query = self.wq_b(self.q_norm(self.wq_a(x))) if self.q_latent else self.wq(x)
        q = query.view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        latent, k_rope = self.wkv_a(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        kv = self.wkv_b(self.kv_norm(latent)).view(batch, seq, self.heads, self.nope + self.v_dim).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        q_nope, q_rope = q.split([self.nope, self.rope_dim], dim=-1)
        # One rotary key per token, shared by every head (MLA's decoupled RoPE).
        k_rope = rotate(k_rope.view(batch, 1, seq, self.rope_dim), cos, sin)
        q = torch.cat([q_nope, rotate(q_rope, cos, sin)], dim=-1)
        k = torch.cat([k_nope, k_rope.expand(batch, self.heads, seq, self.rope_dim)], dim=-1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(batch, seq, self.heads * self.v_dim))


__all__ = ["LatentAttention"]
