"""The decoder's mixtures of experts: routers, the dropping and the dropless (grouped-matmul) MoE.

Two ways to run routed experts, as MaxText has them (layers/moe.py):

* **dropping** (default; MaxText's ``sparse_matmul=False`` with a ``capacity_factor``): each sequence
  gives every expert ceil(seq x top_k / experts) x capacity_factor slots, filled in token order,
  the rest dropped; dispatch and combine are one-hot einsums over [batch, seq, experts, slots].
* **dropless** (MaxText's default since 2024: ``sparse_matmul=True``, ``megablox=True``,
  ``capacity_factor=-1``): every (token, choice) pair is sorted by its expert and the sorted rows
  run through grouped matmuls (`grouped_matmul`, a torch custom op), no token dropped, `sort_group`
  sequences at a time (the planner sets it to a device's, as MaxText's sparse_matmul sorts inside
  its shard_map; the grouping changes no row's result). In plain torch the op is a per-group loop;
  the planner compiles it as a grouped matmul kernel (planner/compiler/grouped_matmul.py).

The routers (`router`), gpt-oss's router and expert biases (added after the grouped matmul by the
expert each sorted row went to, an ``F.embedding`` of the sorted ids) and what is not modelled
(DeepSeek-V3's group-limited routing): docs/planner.md, "Mixtures of experts as run, and latent
attention" and "gpt-oss".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tpu_tuner.model.decoders.decoder_shape import DecoderShape
from tpu_tuner.model.decoders.layer_parts import ACTIVATIONS, FeedForward, gated_activation


@torch.library.custom_op("tpu_tune::grouped_matmul", mutates_args=())
def grouped_matmul(
    x: torch.Tensor, weights: torch.Tensor, group_sizes: torch.Tensor, rowwise: bool, role: str = ""
) -> torch.Tensor:
    """Per sort group b (a sequence or several), rows of ``x[b]`` ([batch, rows, k], sorted by group)
    times their group's ``weights[g]`` ([groups, k, n]); ``group_sizes[b, g]`` rows of b belong to g.
    `rowwise` says which side a tensor-parallel planner splits (True: the contraction, as a down
    projection's; False: the output, as an up projection's); `role` is the output's checkpoint name
    (MaxText's ``mlpwi_0``, ``mlpwi_1``, ``mlpwo``; empty: none), which a planner's remat policy
    reads. Plain torch ignores both."""
    out = x.new_zeros(x.shape[0], x.shape[1], weights.shape[2])
    for b, sizes in enumerate(group_sizes.tolist()):
        start = 0
        for group, size in enumerate(sizes):
            if size:
                out[b, start : start + size] = x[b, start : start + size] @ weights[group]
            start += size
    return out


@torch.library.custom_op("tpu_tune::grouped_matmul_weight_grad", mutates_args=())
def grouped_matmul_weight_grad(
    x: torch.Tensor, grad: torch.Tensor, group_sizes: torch.Tensor, groups: int
) -> torch.Tensor:
    """The gradient of `grouped_matmul`'s weights: per group, its rows of x transposed times grad."""
    out = x.new_zeros(groups, x.shape[2], grad.shape[2])
    for b, sizes in enumerate(group_sizes.tolist()):
        start = 0
        for group, size in enumerate(sizes):
            if size:
                out[group] += x[b, start : start + size].T @ grad[b, start : start + size]
            start += size
    return out


@grouped_matmul.register_fake
def _(x: torch.Tensor, weights: torch.Tensor, group_sizes: torch.Tensor, rowwise: bool, role: str = "") -> torch.Tensor:
    return x.new_empty(x.shape[0], x.shape[1], weights.shape[2])


@grouped_matmul_weight_grad.register_fake
def _(x: torch.Tensor, grad: torch.Tensor, group_sizes: torch.Tensor, groups: int) -> torch.Tensor:
    return x.new_empty(groups, x.shape[2], grad.shape[2])


def _save(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, weights, group_sizes = inputs[:3]
    ctx.save_for_backward(x, weights, group_sizes)


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    x, weights, group_sizes = ctx.saved_tensors
    grad_x = grouped_matmul(grad, weights.transpose(1, 2).contiguous(), group_sizes, False)
    grad_w = grouped_matmul_weight_grad(x, grad, group_sizes, weights.shape[0])
    return grad_x, grad_w, None, None, None


grouped_matmul.register_autograd(_backward, setup_context=_save)


@torch.library.custom_op("tpu_tune::permute_rows", mutates_args=())
def permute_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Each sequence's rows of x ([batch, rows, d]) in the order `index` ([batch, rows], a permutation
    of each sequence's rows) names. Its gradient is the inverse permutation, a gather too, as MaxText's
    `_sort_activations` custom VJP has it (a gather's own gradient is a scatter the TPU compiler sorts)."""
    return x.gather(1, index[..., None].expand(-1, -1, x.shape[-1]))


@permute_rows.register_fake
def _(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)


def _save_index(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(inputs[1])


def _unpermute(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    (index,) = ctx.saved_tensors
    return permute_rows(grad, index.argsort(dim=-1)), None


permute_rows.register_autograd(_unpermute, setup_context=_save_index)


class MixtureOfExperts(nn.Module):
    """Top-k routed experts (stacked [experts, in, out] weights), dropping or dropless (see the
    module docstring), with always-on experts beside them: `shared_experts` MLPs of the expert
    width added ungated (DeepSeek, Llama 4), or one `shared_expert_mlp` wide MLP scaled by
    sigmoid(x . gate) (Qwen2-MoE).

    `n_experts` and `top_k` are read by the model-FLOPs count (only top_k of n_experts experts'
    weights touch each token)."""

    score_bias: torch.Tensor | None  # a buffer: DeepSeek-V3's bias for the sigmoid router, else None
    # Consecutive sequences whose rows the dropless path sorts together (one where it does not divide the batch).
    sort_group: int = 1

    def __init__(self, s: DecoderShape) -> None:
        super().__init__()
        self.n_experts, self.top_k, self.capacity_factor = s.experts, s.top_k, s.capacity_factor
        self.dropless, self.router_kind = s.moe_routing == "dropless", s.router
        self.normalise, self.scaling = s.norm_topk_prob, s.routed_scaling_factor
        # gated: activation(gate, up); plain: activation(up)
        self.activation: Callable[..., torch.Tensor] = gated_activation(s) if s.gated else ACTIVATIONS[s.activation]
        self.router = nn.Linear(s.d_model, s.experts, bias=s.router_bias)
        scale, width = s.d_model**-0.5, s.expert_mlp or s.mlp
        self.w_gate = nn.Parameter(torch.randn(s.experts, s.d_model, width) * scale) if s.gated else None
        self.w_up = nn.Parameter(torch.randn(s.experts, s.d_model, width) * scale)
        self.w_down = nn.Parameter(torch.randn(s.experts, width, s.d_model) * width**-0.5)
        # gpt-oss's expert biases, zero at first (MaxText's default_bias_init); named *_bias, which
        # the model-FLOPs count leaves out as it does every bias.
        with_bias = s.expert_bias
        self.gate_bias = nn.Parameter(torch.zeros(s.experts, width)) if with_bias and s.gated else None
        self.up_bias = nn.Parameter(torch.zeros(s.experts, width)) if with_bias else None
        self.down_bias = nn.Parameter(torch.zeros(s.experts, s.d_model)) if with_bias else None
        # DeepSeek-V3's load-balancing bias (e_score_correction_bias): it picks experts, never weighs them.
        self.register_buffer("score_bias", torch.zeros(s.experts) if s.router == "sigmoid" else None)
        self.shared = FeedForward(s, s.shared_expert_mlp) if s.shared_expert_mlp else None
        # A [1, d_model] weight, not a Linear: a width-1 output is no column to split over tensor.
        self.shared_gate = nn.Parameter(torch.zeros(1, s.d_model)) if s.shared_expert_mlp else None
        self.shared_experts = FeedForward(s, s.shared_experts * width) if s.shared_experts else None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, chosen experts), each [batch, seq, top_k], by the shape's router."""
        logits = self.router(x)
        # fp32 for bf16, fp64 kept (gradcheck); a dtype test, not torch.promote_types, which torchax cannot lower.
        logits = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
        if self.router_kind == "sigmoid":
            scores = torch.sigmoid(logits)
            assert self.score_bias is not None  # registered for the sigmoid router
            chosen = (scores + self.score_bias.float()).topk(self.top_k, dim=-1).indices
            weights = scores.gather(-1, chosen)
        elif self.router_kind == "softmax_topk":
            weights, chosen = logits.softmax(dim=-1).topk(self.top_k, dim=-1)
        else:
            weights, chosen = logits.topk(self.top_k, dim=-1)
            weights = weights.softmax(dim=-1) if self.router_kind == "topk_softmax" else torch.sigmoid(weights)
        if self.normalise and self.router_kind in ("softmax_topk", "sigmoid"):
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return (weights * self.scaling).to(x.dtype), chosen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = self.route(x)
        out = (self._dropless if self.dropless else self._dropping)(x, weights, chosen)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        if self.shared is not None and self.shared_gate is not None:
            out = out + torch.sigmoid(F.linear(x, self.shared_gate.to(x.dtype))) * self.shared(x)
        return out

    def _experts(
        self,
        rows: torch.Tensor,
        matmul: Callable[[torch.Tensor, torch.Tensor, bool, str], torch.Tensor],
        bias_of_rows: Callable[[torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """The gated (or plain) expert MLP over `rows`, each projection by `matmul(rows, weights,
        rowwise, role)` (role: MaxText's checkpoint name of its output, ``mlpwi_0`` the gate,
        ``mlpwi_1`` the up projection, ``mlpwo`` the down one; a plain MLP's up is ``mlpwi_0``),
        plus its bias where the experts have them, `bias_of_rows(bias)` being each row's expert's
        bias in the rows' layout."""

        def project(
            h: torch.Tensor, weights: torch.Tensor, bias: torch.Tensor | None, rowwise: bool, role: str
        ) -> torch.Tensor:
            out = matmul(h, weights, rowwise, role)
            return out if bias is None else out + bias_of_rows(bias)

        hidden = project(rows, self.w_up, self.up_bias, False, "mlpwi_1" if self.w_gate is not None else "mlpwi_0")
        if self.w_gate is not None:
            hidden = self.activation(project(rows, self.w_gate, self.gate_bias, False, "mlpwi_0"), hidden)
        else:
            hidden = self.activation(hidden)
        return project(hidden, self.w_down, self.down_bias, True, "mlpwo")

    def _dropless(self, x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape
        group = self.sort_group if batch % self.sort_group == 0 else 1
        flat = chosen.reshape(batch // group, group * seq * self.top_k)
        order = flat.argsort(dim=-1, stable=True)  # each sort group's (token, choice) pairs by expert
        tokens = x.reshape(batch // group, group * seq, d_model)
        rows = permute_rows(tokens.repeat_interleave(self.top_k, dim=1), order)  # a copy per choice, then sorted
        experts = torch.arange(self.n_experts, device=x.device)
        group_sizes = (flat[..., None] == experts).sum(dim=1).to(torch.int32)  # [sort groups, experts]
        sorted_experts = flat.gather(-1, order)  # [sort groups, rows]: each sorted row's expert
        out = self._experts(
            rows,
            lambda h, w, rowwise, role: grouped_matmul(h, w.to(x.dtype), group_sizes, rowwise, role),
            lambda bias: F.embedding(sorted_experts, bias.to(x.dtype)),
        )
        out = permute_rows(out, order.argsort(dim=-1)).view(batch, seq, self.top_k, d_model)  # token order again
        return (out * weights[..., None]).sum(dim=2)

    def _dropping(self, x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        capacity = int(max(math.ceil(seq * self.top_k / self.n_experts) * self.capacity_factor, self.capacity_factor))
        routed = F.one_hot(chosen, self.n_experts).to(torch.int32)  # [batch, seq, k, experts]
        # 1-based place of each (token, choice) in its expert's slots, in token order; 0: not routed.
        place = routed.reshape(batch, seq * self.top_k, -1).cumsum(dim=1).reshape(routed.shape) * routed
        slots = torch.arange(1, capacity + 1, device=x.device, dtype=torch.int32)
        combine = ((place[..., None] == slots) * weights[..., None, None]).sum(dim=2)  # [batch, seq, experts, slots]
        dispatch = (combine != 0).to(x.dtype)
        expert_in = torch.einsum("bsm,bsec->ebcm", x, dispatch)

        def matmul(h: torch.Tensor, w: torch.Tensor, rowwise: bool, role: str) -> torch.Tensor:
            return torch.einsum("ebcm,emh->ebch", h, w.to(x.dtype))

        out = self._experts(expert_in, matmul, lambda bias: bias.to(x.dtype)[:, None, None, :])  # [experts, 1, 1, n]
        return torch.einsum("ebcm,bsec->bsm", out, combine.to(x.dtype))


__all__ = ["MixtureOfExperts", "grouped_matmul", "grouped_matmul_weight_grad", "permute_rows"]


def routed_per_token(model: nn.Module) -> float:
    """The activations a token sends through dropless routing a step, summed over the routed
    layers: top_k x d_model each (the planner's "+route" term charges HBM passes over them:
    planner/prediction/predict.routed_seconds). A traced Hugging Face MoE's top_k and width are
    read where the module names them (`top_k` or `num_experts_per_tok`; its router's input), else 0."""
    total = 0.0
    for module in model.modules():
        if isinstance(module, MixtureOfExperts):
            total += module.top_k * module.router.in_features if module.dropless else 0.0
        elif isinstance(getattr(module, "experts", None), nn.Module):
            top_k = getattr(module, "top_k", None) or getattr(module, "num_experts_per_tok", None)
            router = getattr(module, "gate", None) or getattr(module, "router", None)
            width = getattr(router, "in_features", None)
            total += top_k * width if isinstance(top_k, int) and isinstance(width, int) else 0.0
    return total


def moe_routing(model: nn.Module) -> str:
    """How `model` routes tokens to experts, as the planner's error band compares it with the
    calibration rows (planner/prediction/band.py): "dense" (no experts), "dropping" (a capacity factor) or
    "dropless". A traced Hugging Face MoE (a module holding an ``experts`` child) computes every
    routed token with no capacity, so it reads dropless."""
    for module in model.modules():
        if isinstance(module, MixtureOfExperts):
            return "dropless" if module.dropless else "dropping"
        if isinstance(getattr(module, "experts", None), nn.Module):
            return "dropless"
    return "dense"
