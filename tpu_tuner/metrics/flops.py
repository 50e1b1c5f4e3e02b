"""FLOPs: counted with FlopCounterMode (gaps filled), and model FLOPs by a named formula.

Counted FLOPs are what the step executes, as torch's FLOP counter sees it. Model FLOPs are the
analytical figure MFU conventionally uses (PaLM / torchtitan / nanoGPT):

* training step: ``6 N + 12 L H Q T`` per token, inference: ``2 N + 4 L H Q T`` per token,
  with N the matmul parameters, L layers, H heads, Q head dimension, T sequence length; where
  value heads have a width of their own (multi-head latent attention: query/key heads Qk = nope +
  rope dimensions, value heads Qv), Q is their mean (Qk + Qv) / 2: the scores cost 2 Qk and the
  weighted values 2 Qv per query, key and head;
* the "full" attention convention counts the attention term whole even under a causal mask
  (PaLM, torchtitan, nanoGPT); the "causal" convention halves it (MaxText since 2025).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

import tpu_tuner.model.decoders.experts  # noqa: F401 - registers the tpu_tune:: grouped matmul ops counted below
from tpu_tuner.metrics.rnn_flops import RNN_FLOP_FORMULAS
from tpu_tuner.model.decoders.attention import local_attention_backward_op, local_attention_op
from tpu_tuner.model.decoders.transformer_dims import AttentionSpan, TransformerDims

aten = torch.ops.aten
AttentionConvention = Literal["full", "causal"]


def _sdpa_forward(query_shape, key_shape, value_shape, *args: Any, **kwargs: Any) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _sdpa_backward(grad_out_shape, query_shape, key_shape, value_shape, *args: Any, **kwargs: Any) -> int:
    """The four gradient matmuls of attention (dQ, dK, dV, dScores), 2x the forward.

    torch's own formula also counts the scores that fused kernels recompute in backward;
    that is hardware work (HFU), not model work, and would break the match with the
    analytical formula and with the unfused path, so it is left out here.
    """
    batch, heads_q, seq_q, dim_qk = query_shape
    seq_k, dim_v = key_shape[2], value_shape[3]
    per_head = 2 * seq_q * seq_k * (dim_v + dim_v + dim_qk + dim_qk)
    return batch * heads_q * per_head


def score_pairs(seq: int, window: int, chunk: int, causal: bool) -> float:
    """The (query, key) pairs one sequence's attention counts in a layer of `window` or `chunk`
    (both 0: global). Not `causal` (the "full" convention, or a non-causal model): the causal mask
    is not discounted: seq^2, seq x window, or every chunk's square. `causal` (MaxText's convention
    C, PRs 2009 and 2030): half of the square, the exact causal band seq x W - W^2 / 2 of a window
    W = min(window, seq), and half of every chunk's square (MaxText's maxtext_utils.py)."""
    if window:
        width = min(window, seq)
        return seq * width - width * width / 2 if causal else float(seq * width)
    if chunk:
        whole, rest = divmod(seq, chunk)
        squares = float(whole * chunk * chunk + rest * rest)
        return squares / 2 if causal else squares
    return seq * seq / 2 if causal else float(seq * seq)


def _local_attention(
    query_shape, key_shape, value_shape, sinks_shape, window: int, chunk: int, *args: Any, **kwargs: Any
) -> int:
    """The package's local attention operator (model/decoders/attention.py): two matmuls over the pairs
    its mask keeps, the causal mask not discounted (as for global attention)."""
    batch, heads, seq, dim_qk = query_shape
    return int(2 * batch * heads * score_pairs(seq, window, chunk, False) * (dim_qk + value_shape[-1]))


def _local_attention_backward(
    grad_shape, query_shape, key_shape, value_shape, sinks_shape, window: int, chunk: int, *args: Any, **kwargs: Any
) -> int:
    return 2 * _local_attention(query_shape, key_shape, value_shape, sinks_shape, window, chunk)


def _grouped_mm(a_shape, b_shape, *args: Any, **kwargs: Any) -> int:
    """``aten._grouped_mm`` (transformers' mixture-of-experts kernel), uncounted by torch 2.13:
    each token row meets the one expert its group names, so a group is an ordinary matmul."""
    if len(a_shape) == 2 and len(b_shape) == 3:  # tokens grouped by rows: (T, K) x (E, K, N)
        return 2 * a_shape[0] * a_shape[1] * b_shape[2]
    if len(a_shape) == 2 and len(b_shape) == 2:  # grouped along the contraction (weight gradients)
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    if len(a_shape) == 3 and len(b_shape) == 2:  # (E, M, K) x (K, N) grouped by columns
        return 2 * a_shape[1] * a_shape[2] * b_shape[1]
    return 2 * a_shape[0] * a_shape[1] * a_shape[2] * b_shape[2]  # batched: (E, M, K) x (E, K, N)


def _rows_grouped(x_shape, other_shape, *args: Any, **kwargs: Any) -> int:
    """The dropless MoE's grouped matmuls (model/decoders/experts.py): every row of x [batch, rows, k] meets
    one group's [k, n] weights, forward (other: the weights [groups, k, n]) or for the weights'
    gradient (other: the output gradient [batch, rows, n]): 2 x batch x rows x k x n either way."""
    return 2 * x_shape[0] * x_shape[1] * x_shape[2] * other_shape[-1]


# Attention kernels whose counts torch's registry misses or counts as hardware work: the CPU flash
# kernels (F.scaled_dot_product_attention counts zero on CPU without these), the "overrideable"
# kernels that PrivateUse1 backends such as TorchTPU dispatch to, and the CUDA kernels' backward
# passes (counted without recomputation, like every other op here).
EXTRA_FLOP_FORMULAS: dict[Any, Callable[..., int]] = {
    aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_forward,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_backward,
    aten._scaled_dot_product_fused_attention_overrideable: _sdpa_forward,
    aten._scaled_dot_product_fused_attention_overrideable_backward: _sdpa_backward,
    aten._scaled_dot_product_flash_attention_backward: _sdpa_backward,
    aten._scaled_dot_product_efficient_attention_backward: _sdpa_backward,
    aten._scaled_dot_product_cudnn_attention_backward: _sdpa_backward,
    aten._grouped_mm: _grouped_mm,
    local_attention_op().overloadpacket: _local_attention,
    local_attention_backward_op().overloadpacket: _local_attention_backward,
    torch.ops.tpu_tune.grouped_matmul: _rows_grouped,
    torch.ops.tpu_tune.grouped_matmul_weight_grad: _rows_grouped,
    # The fused recurrent kernels (nn.LSTM on CPU; LSTM, GRU, RNN on CUDA): see rnn_flops.py.
    **RNN_FLOP_FORMULAS,
}


def flop_counter() -> FlopCounterMode:
    """A FlopCounterMode that also counts the attention and recurrent kernels listed above."""
    return FlopCounterMode(display=False, custom_mapping=EXTRA_FLOP_FORMULAS)


class TrafficCounter(TorchDispatchMode):
    """Counts aten ops and the bytes of their tensor inputs and outputs.

    The byte total is an *unfused* estimate of memory traffic: every op reads its inputs and
    writes its outputs once. Fused or compiled code moves fewer bytes, caches may move fewer.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.bytes = 0
        self.op_counts: Counter[str] = Counter()

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        self.op_counts[str(func.overloadpacket)] += 1
        self.bytes += _tensor_bytes(args) + _tensor_bytes(kwargs) + _tensor_bytes(out)
        return out


def _tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (tuple, list)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


@dataclass(frozen=True)
class CountedFlops:
    """What one step executed, as counted."""

    total: int
    by_op: dict[str, int]
    aten_ops: int
    bytes_unfused: int
    op_counts: dict[str, int] = field(default_factory=dict)


def count_step(step: Callable[[], Any]) -> CountedFlops:
    """Run `step` once under the FLOP and traffic counters (eager; never time this run)."""
    flops = flop_counter()
    traffic = TrafficCounter()
    with flops, traffic:
        step()
    by_op = {str(op): int(n) for op, n in flops.get_flop_counts().get("Global", {}).items()}
    return CountedFlops(
        total=int(flops.get_total_flops()),
        by_op=by_op,
        aten_ops=traffic.ops,
        bytes_unfused=traffic.bytes,
        op_counts=dict(traffic.op_counts.most_common(20)),
    )


def _active_expert_share(module: nn.Module) -> float | None:
    """top_k / n_experts of a mixture of experts (a module with both, as ints), else None."""
    experts, top_k = getattr(module, "n_experts", None), getattr(module, "top_k", None)
    return top_k / experts if isinstance(experts, int) and isinstance(top_k, int) else None


def matmul_parameters(model: nn.Module) -> int:
    """N of the model-FLOPs formula: parameters that multiply activations in matmuls.

    Counts every parameter of two or more dimensions once (tied weights once), except the
    tables of ``nn.Embedding`` modules that no ``nn.Linear`` shares: a lookup does no FLOPs,
    while an output head tied to the embedding does a full matmul. Biases and norm scales
    (1-D) do no matmul FLOPs and are left out, so for a transformer the formula matches the
    counted FLOPs exactly; so are stacked expert biases ([experts, width]: gpt-oss's, named
    ``*bias`` in the generic decoder and in transformers), known by their name, as MaxText's
    count leaves biases out. A mixture of experts counts the experts a token uses (see below).
    """
    # A mixture of experts (a module with `n_experts` and `top_k`) runs top_k of its n_experts
    # experts a token: its stacked expert weights count that share (MaxText's MoE convention).
    active_share = {
        id(p): share
        for m in model.modules()
        if (share := _active_expert_share(m)) is not None
        for p in m.parameters(recurse=False)
        if p.dim() == 3
    }
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    lookup_tables = {
        id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding) and id(m.weight) not in linear_weights
    }
    return sum(
        round(parameter.numel() * active_share.get(id(parameter), 1.0))
        for name, parameter in model.named_parameters()  # named_parameters() already skips tied duplicates
        if id(parameter) not in lookup_tables and parameter.dim() >= 2 and not name.endswith("bias")
    )


@dataclass(frozen=True)
class ModelFlops:
    """Model FLOPs of one step by a named formula."""

    per_step: float
    formula: str
    convention: str
    dense_per_step: float
    attention_per_step: float


def transformer_model_flops(
    matmul_params: int,
    dims: TransformerDims,
    batch_size: int,
    seq_len: int,
    training: bool,
    convention: AttentionConvention = "full",
) -> ModelFlops:
    """``(6N + 12 L H Q T)`` (training) or ``(2N + 4 L H Q T)`` (inference) times tokens."""
    tokens = batch_size * seq_len
    dense_factor, attention_factor = (6, 12) if training else (2, 4)
    halved = convention == "causal" and dims.causal
    spans = dims.spans or (AttentionSpan(dims.heads, dims.head_dim),) * dims.layers
    value_dim = dims.value_head_dim or dims.head_dim
    # Half the factor per head-width dimension: scores (query/key width) and weighted values (value
    # width, MLA's own; else the span's head width).
    per_sequence = sum(
        span.heads
        * (span.head_dim + (dims.value_head_dim or span.head_dim))
        / 2
        * score_pairs(seq_len, span.window, span.chunk, halved)
        for span in spans
    )
    dense = dense_factor * matmul_params * tokens
    attention = attention_factor * per_sequence * batch_size
    name = f"{dense_factor}N + {attention_factor}LHQT" + (" / 2 (causal)" if halved else "")
    if dims.spans and any(span.window or span.chunk for span in spans):
        name += ", local layers by their window or chunks"
    label = (
        "causal attention counted as half (MaxText)"
        if halved
        else "full attention, causal mask not discounted (PaLM / torchtitan / nanoGPT)"
    )
    return ModelFlops(
        per_step=float(dense + attention),
        formula=f"({name}) x tokens, N={matmul_params:,} matmul parameters, "
        f"L={dims.layers}, H={dims.heads}, "
        f"{f'Q=(Qk {dims.head_dim} + Qv {value_dim}) / 2' if value_dim != dims.head_dim else f'Q={dims.head_dim}'}, "
        f"T={seq_len}, tokens={tokens:,}",
        convention=label,
        dense_per_step=float(dense),
        attention_per_step=float(attention),
    )
