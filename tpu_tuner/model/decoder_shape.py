"""The generic decoder's shape (`DecoderShape`), read from a TOML file or an inline spec.

A model shape in a small TOML file (or inline: ``decoder:d_model=4096,layers=32,heads=32``), no
model code: Llama-style (gated SiLU MLP, RMSNorm, rotary positions, grouped-query attention) by
default, GPT-3-style with ``gated = false``, ``activation = "gelu"``, ``norm = "layer"``,
``positions = "learned"``, ``tied_embeddings = true``. model/decoder.py builds the model.

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
activation = "gelu"    # silu (default), gelu, gelu_tanh, relu
norm = "layer"         # rms (default), layer (with a bias)
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

The Hugging Face families the planner maps onto the decoder (model/hf_decoder.py) need more,
all off by default: ``qkv_bias`` / ``out_bias`` / ``mlp_bias`` (Qwen2, GPT-2, GPT-NeoX),
``qk_norm`` (Qwen3: an RMSNorm of each query and key head), ``post_norms`` (Gemma 2: norms on the
attention's and the MLP's outputs as well), ``parallel_residual`` (GPT-NeoX: attention and MLP
read the same input), ``rotary_fraction`` (GPT-NeoX, Phi-3: the share of each head's dimensions
rotated), ``expert_mlp`` (each expert's width where it differs from the dense ``mlp``),
``shared_expert_mlp`` (Qwen2-MoE: an always-on MLP beside the routed experts, behind a sigmoid
gate) and ``dense_layers`` (layers whose MLP is dense among expert layers: ``mlp_only_layers``).

Mixtures of experts as run and latent attention (model/experts.py, model/latent_attention.py), off
by default: ``moe_routing = "dropless"`` (every token through grouped matmuls; capacity_factor
unused), ``router`` (topk_softmax, softmax_topk, sigmoid, topk_sigmoid) with ``norm_topk_prob`` and
``routed_scaling_factor``, ``shared_experts`` (ungated always-on experts of width expert_mlp), and
multi-head latent attention when ``kv_lora_rank`` > 0, with ``q_lora_rank``, ``qk_nope_head_dim``,
``qk_rope_head_dim`` and ``v_head_dim``.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from tpu_tuner.core.errors import WorkloadError
from tpu_tuner.core.key_values import parse_key_values

INLINE_PREFIX = "decoder:"
ACTIVATION_NAMES = ("silu", "gelu", "gelu_tanh", "relu")  # gelu_tanh: GELU's tanh approximation (GPT-2, Gemma)
NORMS = ("rms", "layer")
POSITIONS = ("rope", "learned")
MOE_ROUTINGS = ("dropping", "dropless")
ROUTERS = ("topk_softmax", "softmax_topk", "sigmoid", "topk_sigmoid")


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
    experts: int = 0  # a mixture of experts in every block when > 0 (each expert an MLP of width `expert_mlp`)
    top_k: int = 2  # experts per token
    capacity_factor: float = 1.25  # expert slots per sequence: ceil(seq x top_k / experts) x this
    qkv_bias: bool = False  # biases on the query, key and value projections
    out_bias: bool = False  # a bias on the attention's output projection
    mlp_bias: bool = False  # biases on the MLP's projections (dense MLPs and shared expert)
    qk_norm: bool = False  # an RMSNorm (head_dim wide) of every query and key head
    post_norms: bool = False  # a norm on the attention's and on the MLP's output too (Gemma 2)
    parallel_residual: bool = False  # x + attention(norm(x)) + mlp(norm'(x)) (GPT-NeoX)
    rotary_fraction: float = 1.0  # share of each head's dimensions the rotary embedding turns
    expert_mlp: int | None = None  # each routed expert's width (default: mlp)
    shared_expert_mlp: int = 0  # width of an always-on, sigmoid-gated MLP beside the experts (0: none)
    dense_layers: tuple[int, ...] = ()  # with experts: the layers whose MLP is dense (width mlp)
    # Mixtures of experts as run, and multi-head latent attention (model/experts.py,
    # model/latent_attention.py; checked by check_experts_and_latent).
    moe_routing: str = "dropping"  # or "dropless": tokens sorted by expert through grouped matmuls, none dropped
    router: str = "topk_softmax"  # topk_softmax, softmax_topk, sigmoid (DeepSeek-V3), topk_sigmoid (Llama 4)
    norm_topk_prob: bool = False  # softmax_topk / sigmoid: renormalise the chosen weights to sum to 1
    routed_scaling_factor: float = 1.0  # the routed experts' weights times this (DeepSeek-V3: 2.5)
    shared_experts: int = 0  # always-on experts of width expert_mlp, added ungated (DeepSeek, Llama 4)
    kv_lora_rank: int = 0  # > 0: multi-head latent attention, keys and values from a latent this wide
    q_lora_rank: int = 0  # with latent attention: the query's latent width (0: a full query projection)
    qk_nope_head_dim: int = 0  # each query/key head's dimensions without rotary positions
    qk_rope_head_dim: int = 0  # ... and with them (one rotary key shared by every head)
    v_head_dim: int = 0  # each value head's width

    def __post_init__(self) -> None:
        # A TOML array arrives as a list; the shape stays hashable.
        object.__setattr__(self, "dense_layers", tuple(self.dense_layers))

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def n_head_dim(self) -> int:
        if self.kv_lora_rank:  # latent attention: the query/key head (the value head is v_head_dim)
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        return self.head_dim or self.d_model // self.heads

    @property
    def rotary_dim(self) -> int:
        """How many of each head's dimensions the rotary embedding turns (GPT-NeoX's rotary_ndims)."""
        if self.kv_lora_rank:
            return self.qk_rope_head_dim
        return int(self.n_head_dim * self.rotary_fraction)

    def has_experts(self, layer: int) -> bool:
        """Whether block `layer` routes to experts (else its MLP is dense)."""
        return self.experts > 0 and layer not in self.dense_layers

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
        if self.head_dim is None and not self.kv_lora_rank and self.d_model % self.heads:
            raise WorkloadError(f"d_model ({self.d_model}) is not a multiple of heads ({self.heads}): give head_dim",
                                where)
        if self.positions == "rope" and (self.rotary_dim % 2 or not 0 < self.rotary_fraction <= 1):
            raise WorkloadError(f"rotary positions need an even rotated dimension in (0, head_dim], not "
                                f"{self.rotary_dim} of {self.n_head_dim}", where)
        if any(not 0 <= layer < self.layers for layer in self.dense_layers):
            raise WorkloadError(f"dense_layers must name layers 0 to {self.layers - 1}, not {list(self.dense_layers)}",
                                where)
        if (self.expert_mlp is not None and self.expert_mlp < 1) or self.shared_expert_mlp < 0:
            raise WorkloadError(f"expert widths must be positive, not expert_mlp {self.expert_mlp}, "
                                f"shared_expert_mlp {self.shared_expert_mlp}", where)
        for name, allowed in (("activation", ACTIVATION_NAMES), ("norm", NORMS), ("positions", POSITIONS)):
            if getattr(self, name) not in allowed:
                raise WorkloadError(f"{name} must be one of {', '.join(allowed)}, not {getattr(self, name)!r}", where)
        self.check_experts_and_latent(where)

    def check_experts_and_latent(self, where: str | Path) -> None:
        """The routing, shared-expert and latent-attention keys (a one-line WorkloadError naming `where`)."""
        for name, allowed in (("moe_routing", MOE_ROUTINGS), ("router", ROUTERS)):
            if getattr(self, name) not in allowed:
                raise WorkloadError(f"{name} must be one of {', '.join(allowed)}, not {getattr(self, name)!r}", where)
        if self.shared_experts < 0 or self.routed_scaling_factor <= 0:
            raise WorkloadError(f"shared_experts must be 0 or more and routed_scaling_factor above 0, not "
                                f"{self.shared_experts} and {self.routed_scaling_factor}", where)
        if self.shared_experts and self.shared_expert_mlp:
            raise WorkloadError("give shared_experts (ungated, DeepSeek / Llama 4) or shared_expert_mlp (gated, "
                                "Qwen2-MoE), not both", where)
        latent = ("q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        if not self.kv_lora_rank:
            if any(getattr(self, name) for name in latent):
                raise WorkloadError(f"{', '.join(latent)} need latent attention: give kv_lora_rank", where)
            return
        if self.kv_lora_rank < 0 or self.q_lora_rank < 0 or min(self.qk_nope_head_dim, self.v_head_dim) < 1:
            raise WorkloadError(f"latent attention needs kv_lora_rank, qk_nope_head_dim and v_head_dim of at least 1 "
                                f"and q_lora_rank of 0 or more, not {self.kv_lora_rank}, {self.qk_nope_head_dim}, "
                                f"{self.v_head_dim}, {self.q_lora_rank}", where)
        if self.positions != "rope" or self.qk_rope_head_dim < 2 or self.qk_rope_head_dim % 2:
            raise WorkloadError(f"latent attention turns an even qk_rope_head_dim (at least 2) with rotary positions, "
                                f"not {self.qk_rope_head_dim} with {self.positions!r} positions", where)
        if self.kv_heads not in (None, self.heads) or self.head_dim is not None or self.qk_norm:
            raise WorkloadError("latent attention has one key/value head per query head, its head widths from "
                                "qk_nope_head_dim + qk_rope_head_dim and v_head_dim, and no qk_norm: drop kv_heads, "
                                "head_dim and qk_norm", where)


def is_shape_source(path: str | Path) -> bool:
    """Whether `path` names a decoder shape (a .toml file, or an inline ``decoder:...`` spec)."""
    text = str(path)
    return text.startswith(INLINE_PREFIX) or text.endswith(".toml")


def read_shape(path: str | Path) -> tuple[DecoderShape, dict[str, int], str]:
    """The shape, the run sizes ([run]) and a name, from a TOML file or an inline spec."""
    text = str(path)
    if text.startswith(INLINE_PREFIX):
        model: dict[str, Any] = parse_key_values(text[len(INLINE_PREFIX):], text, WorkloadError)
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


__all__ = ["ACTIVATION_NAMES", "DecoderShape", "INLINE_PREFIX", "MOE_ROUTINGS", "NORMS", "POSITIONS", "ROUTERS",
           "is_shape_source", "read_shape"]
