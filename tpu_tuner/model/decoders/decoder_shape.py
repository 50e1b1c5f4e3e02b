"""The generic decoder's shape (`DecoderShape`), read from a TOML file or an inline spec.

A model shape in a small TOML file (or inline: ``decoder:d_model=4096,layers=32,heads=32``), no
model code: Llama-style (gated SiLU MLP, RMSNorm, rotary positions, grouped-query attention) by
default, GPT-3-style with ``gated = false``, ``activation = "gelu"``, ``norm = "layer"``,
``positions = "learned"``, ``tied_embeddings = true``. model/decoders/decoder.py builds the model. The
file's ``[model]`` table holds `DecoderShape`'s fields (each key's meaning and default beside its
field); an optional ``[run]`` table, the step's default ``batch_size`` and ``seq_len``
(--global-batch / --seq override them). The keys in prose, and whose models use them:
docs/planner.md, "A shape without code", "Attention patterns", "Mixtures of experts as run, and
latent attention", "gpt-oss" and "Layers that share keys and values" (Gemma 3n / Gemma 4 E2B, E4B).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from tpu_tuner.core.errors import WorkloadError
from tpu_tuner.core.field_types import wrong_type
from tpu_tuner.core.key_values import parse_key_values
from tpu_tuner.model.decoders.shape_checks import check_gpt_oss_keys, check_layer_sharing
from tpu_tuner.model.decoders.shape_keys import refuse_incomplete

INLINE_PREFIX = "decoder:"
ACTIVATION_NAMES = ("silu", "gelu", "gelu_tanh", "relu", "clamped_swiglu")  # gelu_tanh: GELU's tanh approximation
# (GPT-2, Gemma); clamped_swiglu: gpt-oss's gate (gated MLPs only: it reads the gate and the up projection)
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
    # Attention patterns (docs/planner.md): local layers' window or chunk, which layers are global.
    sliding_window: int = 0  # local layers attend to the last `sliding_window` tokens (0: no window)
    attention_chunk: int = 0  # local layers attend causally within chunks of this many tokens (0: none)
    global_every: int = 0  # layers i with (i + 1) % global_every == 0 are global (0: all local, or all global)
    global_head_dim: int | None = None  # the global layers' head width (default: head_dim)
    global_kv_heads: int | None = None  # the global layers' KV heads (default: kv_heads)
    global_rope: bool = True  # False: global layers have no rotary positions (NoPE)
    global_shared_kv: bool = False  # global layers project keys once and use them as values too
    attention_sinks: bool = False  # a learned per-head logit in every softmax's denominator
    moe_every: int = 1  # with experts: layers i with (i + 1) % moe_every == 0 route to experts
    # Mixtures of experts as run, and multi-head latent attention (model/decoders/experts.py,
    # model/decoders/latent_attention.py; checked by check_experts_and_latent).
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
    # gpt-oss's MoE (MaxText's layers/moe.py at 998b3e3, transformers' modeling_gpt_oss.py; docs/planner.md,
    # "gpt-oss"; checked by shape_checks.check_gpt_oss_keys).
    router_bias: bool = False  # a bias on the router's logits
    expert_bias: bool = False  # biases on each routed expert's gate, up and down projections
    swiglu_alpha: float = 1.702  # clamped_swiglu: out = (up + 1) x gate x sigmoid(alpha x gate)
    swiglu_limit: float = 7.0  # clamped_swiglu: gate clipped above at it, up to [-limit, limit]
    # Gemma 3n / Gemma 4's small models (model/decoders/shape_checks.py; checked by check_layer_sharing).
    kv_shared_layers: int = 0  # the last N layers reuse the K/V of the last earlier layer of their kind
    per_layer_input: int = 0  # width of each layer's own input (a second embedding table, a gate)
    per_layer_vocab: int = 0  # the per-layer table's rows (0: vocab)
    double_wide_mlp: bool = False  # the KV-shared layers' MLP is 2 x mlp wide

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
        return self.experts > 0 and layer not in self.dense_layers and (layer + 1) % self.moe_every == 0

    @property
    def has_local_layers(self) -> bool:
        return bool(self.sliding_window or self.attention_chunk)

    def is_global(self, layer: int) -> bool:
        """Whether layer `layer` attends to the whole (causal) sequence rather than a window or chunk."""
        if not self.has_local_layers:
            return True
        return self.global_every > 0 and (layer + 1) % self.global_every == 0

    def is_kv_shared(self, layer: int) -> bool:
        """Whether layer `layer` reads another layer's keys and values (it projects none)."""
        return layer >= self.layers - self.kv_shared_layers

    def layer_kind(self, layer: int) -> tuple[bool, bool, bool]:
        """What makes two layers' blocks differ in structure: (global attention, routed experts, KV shared)."""
        return self.is_global(layer), self.has_experts(layer), self.is_kv_shared(layer)

    def layer_groups(self, first: int = 0) -> tuple[int, int, int]:
        """(leading, period, groups): the layers as `leading` blocks of their own, then `groups`
        repeats of a pattern of `period` blocks, then the rest (a partial pattern). Chosen for the
        fewest distinct blocks to compile (leading + period + the rest), then the fewest leading:
        DeepSeek-V3's 3 dense layers lead 58 like ones, Gemma 3's 5 local : 1 global repeats with
        period 6, a uniform model is (0, 1, layers). The planner scans the repeats (MaxText's
        scannable blocks of a layer pattern) and unrolls the rest. With `first`, of layers `first`
        on (`leading` counted from it): the KV-shared layers, scanned apart (model/decoders/decoder.py)."""
        kinds = [self.layer_kind(i) for i in range(first, self.layers)]
        best: tuple[int, int, int, int] | None = None  # (blocks to compile, leading, period, groups)
        for leading in range(len(kinds)):
            rest = kinds[leading:]
            period = next(p for p in range(1, len(rest) + 1) if all(kind == rest[i % p] for i, kind in enumerate(rest)))
            groups = len(rest) // period
            candidate = (leading + period + len(rest) - period * groups, leading, period, groups)
            best = candidate if best is None or candidate < best else best
        assert best is not None  # a model has at least one layer (check)
        return best[1], best[2], best[3]

    def attention_heads(self, layer: int) -> tuple[int, int, int]:
        """(query heads, KV heads, head width) of layer `layer`."""
        if self.is_global(layer) and self.has_local_layers:
            return self.heads, self.global_kv_heads or self.n_kv_heads, self.global_head_dim or self.n_head_dim
        return self.heads, self.n_kv_heads, self.n_head_dim

    def attention_span(self, layer: int) -> tuple[int, int]:
        """(window, chunk) of layer `layer`: (0, 0) for a global layer."""
        if self.is_global(layer):
            return 0, 0
        return self.sliding_window, self.attention_chunk

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
            raise WorkloadError(
                f"heads ({self.heads}) must divide d_model ({self.d_model}), each head d_model / heads wide: d_model "
                f"({self.d_model}) is not a multiple of heads ({self.heads}); give heads that divide it, or head_dim",
                where,
            )
        if self.positions == "rope" and (self.rotary_dim % 2 or not 0 < self.rotary_fraction <= 1):
            raise WorkloadError(
                f"rotary positions need an even rotated dimension in (0, head_dim], not "
                f"{self.rotary_dim} of {self.n_head_dim}",
                where,
            )
        if any(not 0 <= layer < self.layers for layer in self.dense_layers):
            raise WorkloadError(
                f"dense_layers must name layers 0 to {self.layers - 1}, not {list(self.dense_layers)}", where
            )
        if (self.expert_mlp is not None and self.expert_mlp < 1) or self.shared_expert_mlp < 0:
            raise WorkloadError(
                f"expert widths must be positive, not expert_mlp {self.expert_mlp}, "
                f"shared_expert_mlp {self.shared_expert_mlp}",
                where,
            )
        self._check_attention_pattern(where)
        for name, allowed in (("activation", ACTIVATION_NAMES), ("norm", NORMS), ("positions", POSITIONS)):
            if getattr(self, name) not in allowed:
                raise WorkloadError(f"{name} must be one of {', '.join(allowed)}, not {getattr(self, name)!r}", where)
        self.check_experts_and_latent(where)
        check_gpt_oss_keys(self, where)
        check_layer_sharing(self, where)

    def check_experts_and_latent(self, where: str | Path) -> None:
        """The routing, shared-expert and latent-attention keys (a one-line WorkloadError naming `where`)."""
        for name, allowed in (("moe_routing", MOE_ROUTINGS), ("router", ROUTERS)):
            if getattr(self, name) not in allowed:
                raise WorkloadError(f"{name} must be one of {', '.join(allowed)}, not {getattr(self, name)!r}", where)
        if self.shared_experts < 0 or self.routed_scaling_factor <= 0:
            raise WorkloadError(
                f"shared_experts must be 0 or more and routed_scaling_factor above 0, not "
                f"{self.shared_experts} and {self.routed_scaling_factor}",
                where,
            )
        if self.shared_experts and self.shared_expert_mlp:
            raise WorkloadError(
                "give shared_experts (ungated, DeepSeek / Llama 4) or shared_expert_mlp (gated, Qwen2-MoE), not both",
                where,
            )
        latent = ("q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        if not self.kv_lora_rank:
            if any(getattr(self, name) for name in latent):
                raise WorkloadError(f"{', '.join(latent)} need latent attention: give kv_lora_rank", where)
            return
        if self.kv_lora_rank < 0 or self.q_lora_rank < 0 or min(self.qk_nope_head_dim, self.v_head_dim) < 1:
            raise WorkloadError(
                f"latent attention needs kv_lora_rank, qk_nope_head_dim and v_head_dim of at least 1 "
                f"and q_lora_rank of 0 or more, not {self.kv_lora_rank}, {self.qk_nope_head_dim}, "
                f"{self.v_head_dim}, {self.q_lora_rank}",
                where,
            )
        if self.positions != "rope" or self.qk_rope_head_dim < 2 or self.qk_rope_head_dim % 2:
            raise WorkloadError(
                f"latent attention turns an even qk_rope_head_dim (at least 2) with rotary positions, "
                f"not {self.qk_rope_head_dim} with {self.positions!r} positions",
                where,
            )
        if self.kv_heads not in (None, self.heads) or self.head_dim is not None or self.qk_norm:
            raise WorkloadError(
                "latent attention has one key/value head per query head, its head widths from "
                "qk_nope_head_dim + qk_rope_head_dim and v_head_dim, and no qk_norm: drop kv_heads, "
                "head_dim and qk_norm",
                where,
            )

    def _check_attention_pattern(self, where: str | Path) -> None:
        if min(self.sliding_window, self.attention_chunk, self.global_every) < 0 or self.moe_every < 1:
            raise WorkloadError(
                "sliding_window, attention_chunk and global_every must be at least 0, moe_every at least 1", where
            )
        if self.sliding_window and self.attention_chunk:
            raise WorkloadError(
                "a layer attends through a sliding window or in chunks, not both: give "
                "sliding_window or attention_chunk",
                where,
            )
        if self.sliding_window > self.max_seq_len or self.attention_chunk > self.max_seq_len:
            raise WorkloadError(
                f"the window ({self.sliding_window or self.attention_chunk}) is larger than "
                f"max_seq_len ({self.max_seq_len})",
                where,
            )
        global_only = ("global_every", "global_head_dim", "global_kv_heads")
        if not self.has_local_layers and any(getattr(self, key) for key in global_only):
            raise WorkloadError(
                "global_every, global_head_dim and global_kv_heads need local layers: give "
                "sliding_window or attention_chunk",
                where,
            )
        heads, kv_heads, head_dim = self.attention_heads(self.global_every - 1 if self.global_every else 0)
        if heads % kv_heads or head_dim < 1:
            raise WorkloadError(
                f"the global layers' heads ({heads}) must be a multiple of their kv heads "
                f"({kv_heads}), with a positive head width ({head_dim})",
                where,
            )
        if self.positions == "rope" and int(head_dim * self.rotary_fraction) % 2:
            raise WorkloadError(
                f"rotary positions need an even rotated dimension of the global layers' {head_dim}-wide heads", where
            )


def is_shape_source(path: str | Path) -> bool:
    """Whether `path` names a decoder shape (a .toml file, or an inline ``decoder:...`` spec)."""
    text = str(path)
    return text.startswith(INLINE_PREFIX) or text.endswith(".toml")


def read_shape(path: str | Path) -> tuple[DecoderShape, dict[str, int], str]:
    """The shape, the run sizes ([run]) and a name, from a TOML file or an inline spec."""
    text = str(path)
    if text.startswith(INLINE_PREFIX):
        model: dict[str, Any] = parse_key_values(text[len(INLINE_PREFIX) :], text, WorkloadError)
        run: dict[str, Any] = {}
        name = "decoder"
    else:
        file = Path(path)
        if not file.is_file():
            raise WorkloadError("file not found", file)
        try:
            data = tomllib.loads(file.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise WorkloadError(f"not valid TOML: {exc}", file) from exc
        model, run, name = data.get("model", {}), data.get("run", {}), file.stem
        if not isinstance(model, dict) or not model:
            raise WorkloadError("no [model] table with the decoder's shape (d_model, layers, heads, ...)", file)
    known = {f.name for f in fields(DecoderShape)}
    unknown = sorted(set(model) - known)
    if unknown:
        raise WorkloadError(f"unknown shape key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}", path)
    wrong = wrong_type(DecoderShape, model)
    if wrong:
        raise WorkloadError(wrong, path)
    refuse_incomplete(DecoderShape, model, path)  # the keys missing and what they mean, not a TypeError
    shape = DecoderShape(**model)
    shape.check(path)
    sizes = {k: v for k, v in run.items() if k in ("batch_size", "seq_len")} if isinstance(run, dict) else {"": run}
    if any(type(v) is not int or v < 1 for v in sizes.values()):
        raise WorkloadError(f"[run] takes batch_size and seq_len of at least 1, not {run!r}", path)
    return shape, sizes, name


__all__ = [
    "ACTIVATION_NAMES",
    "DecoderShape",
    "INLINE_PREFIX",
    "MOE_ROUTINGS",
    "NORMS",
    "POSITIONS",
    "ROUTERS",
    "is_shape_source",
    "read_shape",
]
