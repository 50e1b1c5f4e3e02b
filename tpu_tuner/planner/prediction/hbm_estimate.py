"""An estimate of a point's HBM per device before any compile ("memory first", issue 57).

The lower bound (space.memory_lower_bound) rules out only points that cannot fit whatever the
compiler does; this estimate says where a point is likely to land, so the search spends compiles
on points estimated to fit and can say which knob would make a point fit. Its terms, per device:

* **weights** and **optimizer state**: every parameter (inactive experts and lookup tables
  included) in the weights' dtype, AdamW's first moment in its own dtype and second in the
  weights' (SGD: none; optimizer.py), split over the parameter axes (fsdp, context, tensor,
  fsdp_transpose, expert): the compiled step's arguments;
* **gradients**: the gradients and the step's bf16 copy of the weights, over the same shards;
  with micro-batches, the fp32 gradient sum besides;
* **gathered**: a layer's weights gathered over fsdp in bf16 (split over tensor, and expert under capacity routing),
  and the output head gathered with its gradient;
* **saved activations**: for every layer, what the remat policy keeps in HBM (remat.py: the block
  input unless offloaded, each named tensor kept on the device), in bf16, tokens split over the
  batch and context axes, features over tensor;
* **working set**: one layer's forward recomputed and its backward (every named tensor of a
  layer, context's gathered keys and values);
* **logits**: the loss's [tokens, vocab / tensor] buffers, one tile of them under vocab tiling;
  where the compiler windows the FSDP collectives (fsdp groups of at most `WINDOWED_FSDP`), the
  logits' bf16 cotangent besides, held through the backward loop;
* **MoE dispatch** (in the working set): a mixture of experts' routed rows of one layer, a
  d_model-wide row for each of a token's top_k choices (times the capacity factor where the layer
  drops tokens), and under capacity routing the dispatch and combine masks (moe_dispatch_width);
  dropless routing keeps more copies of them (`dropless`: the rows sorted by expert, the ragged
  matmuls' outputs, unsorted, and their cotangents) than capacity routing's einsums;
* **side tables** (in the gathered term): lookup tables besides the token embedding (Gemma 3n / 4's
  per-layer inputs), whose gradient every device builds whole in bf16, and the per-layer inputs
  a token reads from them.

The constants (`FITTED`) are fitted to the compiled peaks the project keeps (benchmarks/
calibration_compiled.json, `python benchmarks/planner/plan_memory_estimate.py --fit`), but for the held
cotangent and the side tables, whose copies buffer assignments count; the activation terms carry
one factor per remat family, as the data shows they differ (docs/planner.md, "Memory first").
"""

from __future__ import annotations

import operator
from dataclasses import asdict, astuple, dataclass
from functools import reduce
from typing import TYPE_CHECKING

from tpu_tuner.planner.compiler.optimizer import state_bytes_per_parameter
from tpu_tuner.planner.compiler.remat import BLOCK_INPUT, RematPolicy, parse_remat

if TYPE_CHECKING:
    from tpu_tuner.planner.plans.plan_problem import PlanProblem
    from tpu_tuner.planner.plans.plan_space import PlanPoint

# A point is compiled when its estimate is at most this share of the compiler's HBM limit: the
# estimate's errors on the kept peaks (docs/planner.md, "Memory first") are mostly within 10%, so
# a point estimated at 90% of the limit may still fit and one above it rarely does.
FIT_MARGIN = 0.9
BF16 = 2.0
# The TPU compiler decomposes the FSDP all-gathers and reduce-scatters into windowed loops
# (collective-permutes around slices of the matmuls) on fsdp groups of at most 32 devices, and
# then holds the logits' cotangent through the backward loop: every kept compile with fsdp <= 32
# has the loops, none with 64 or more (benchmarks/planner/calibration_compiled.json's permutes; Llama 3.1
# 8B's buffers on v6e-32 against v6e-64, docs/planner.md "Memory first").
WINDOWED_FSDP = 32


@dataclass(frozen=True)
class Fitted:
    """The estimate's constants: multipliers of its physical terms, least-squares fitted to the
    kept compiled peaks' relative error (benchmarks/planner/plan_memory_estimate.py --fit prints them),
    except the two a buffer assignment counts (`held_cotangent`, `side_tables`: kept at one)."""

    gradients: float = 1.0  # x (weight bytes + 2) bytes a parameter shard: gradients + the bf16 copy
    gathered: float = 1.0  # x one layer's bf16 weights gathered, and the head with its gradient
    logits: float = 1.0  # bytes a logit (bf16 logits, their fp32 softmax's cotangent: fitted)
    dispatch: float = 1.0  # x a mixture of experts' routed rows of one layer (moe_dispatch_width)
    dropless: float = 1.0  # x the same rows again where the routing is dropless (more copies kept)
    held_cotangent: float = 1.0  # x the logits' bf16 cotangent held through a windowed program's backward
    side_tables: float = 1.0  # x the side lookup tables' whole gradients and per-layer inputs (side_tables)
    # x the activations (saved + working set), by remat family (RematPolicy.family).
    activations: tuple[tuple[str, float], ...] = ()

    def activation_factor(self, family: str) -> float:
        return dict(self.activations).get(family, 1.0)


# Fitted to the 41 kept compiled peaks (`python benchmarks/planner/plan_memory_estimate.py --fit`, 2026-12-06):
# 93% of them within 10% in sample, 90% left out (docs/planner.md, "Memory first"). The held
# cotangent and the side tables are counted from buffer assignments (one copy; two tables), not fitted.
FITTED = Fitted(
    gradients=1.229,
    gathered=0.961,
    logits=1.072,
    dispatch=6.262,
    dropless=5.839,
    held_cotangent=1.0,
    side_tables=1.0,
    activations=(("full", 0.952), ("minimal", 0.884), ("device", 0.942), ("offload", 1.336)),
)


@dataclass(frozen=True)
class MemoryEstimate:
    """A point's estimated HBM per device, by term (bytes)."""

    weights: float
    optimizer_state: float
    gradients: float
    gathered: float
    saved_activations: float
    working_set: float
    logits: float

    @property
    def total(self) -> float:
        return reduce(operator.add, astuple(self))  # left to right: not sum(), which compensates on 3.12+

    def fits(self, hbm: float, margin: float = FIT_MARGIN) -> bool:
        """Whether the estimate is within `margin` of the HBM limit `hbm`."""
        return self.total <= margin * hbm

    def beyond(self, hbm: float, margin: float = FIT_MARGIN) -> bool:
        """Whether the estimate exceeds the HBM limit `hbm` by more than its error (`margin`): read
        `1 - margin` low, it still would not fit. The search rules out only such points; one
        estimated between `margin` and `1 / margin` of the limit may fit, and the compiler says."""
        return self.total * margin > hbm

    def text(self, hbm: float) -> str:
        """'est 84.1 GiB / 95.7 GiB', as a plan row shows it."""
        return f"est {self.total / 2**30:.1f} GiB / {hbm / 2**30:.1f} GiB"

    def terms(self) -> dict[str, float]:
        """Each term in bytes, and the total (plan.json's `memory_estimate`)."""
        return {**asdict(self), "total": self.total}


@dataclass(frozen=True)
class LayerWidths:
    """One average layer's named tensors, in elements a token (before any sharding)."""

    d_model: int
    query: float
    key_value: float  # key and value together
    context: float
    mlp: float  # one MLP input projection's output (gate or up); the active experts' under MoE
    gated: bool
    experts: bool  # a mixture of experts: its MLP tensors carry no names (recomputed, remat.py)

    def named(self, policy: RematPolicy, tensor: int) -> tuple[float, float]:
        """(the widths `policy` keeps on the device, every named width) a token, over `tensor`."""
        parts = {
            "query_proj": self.query,
            "key_proj": self.key_value / 2,
            "value_proj": self.key_value / 2,
            "context": self.context,
            "out_proj": self.d_model,
            "mlpwi_0": self.mlp,
            "mlpwi_1": self.mlp if self.gated else 0.0,
            "mlpwo": self.d_model,
        }
        kept = sum(
            width
            for name, width in parts.items()
            if policy.action(name) == "device" and not (self.experts and name.startswith("mlp"))
        )
        return kept / tensor, sum(parts.values()) / tensor


def layer_widths(problem: PlanProblem) -> LayerWidths:
    """The average layer's tensor widths: from every layer's attention span where layers differ,
    the MLP from the active matmul parameters where the model holds more parameters than it uses
    a token (a mixture of experts)."""
    shape, head_dim = problem.dims.shape, problem.dims.head_dim
    layers = max(1, shape.n_layers)
    spans = problem.spans
    if spans:
        query = sum(s.heads * s.head_dim for s in spans) / len(spans)
        kv = sum(2 * (shape.n_kv_heads if s.kv_heads is None else s.kv_heads) * s.head_dim for s in spans) / len(spans)
    else:
        query, kv = shape.n_heads * head_dim, 2 * shape.n_kv_heads * head_dim
    head = shape.vocab * shape.d_model
    experts = problem.dims.experts > 0
    per_layer = max(0.0, (problem.matmul_parameters - head) / layers) / shape.d_model  # widths a layer's matmuls add
    mlp_matrices = 3 if problem.gated else 2
    mlp = float(shape.mlp_hidden)
    if experts:
        # Capacity routing computes every expert's slots, filled or not: capacity factor x the rows.
        mlp = max(0.0, per_layer - 2 * query - kv) / mlp_matrices * (problem.dims.capacity_factor or 1.0)
    elif not spans:
        # A traced model may name its key/value heads in a way read_dims does not read (it then takes
        # the query heads' count): a dense layer's matmul parameters say what its keys and values are.
        kv = min(kv, max(0.0, per_layer - 2 * query - mlp_matrices * mlp))
    return LayerWidths(shape.d_model, query, kv, query, mlp, problem.gated, experts)


def moe_dispatch_width(problem: PlanProblem) -> float:
    """Elements a token puts in one MoE layer's routed buffers: a d_model-wide row for each of its
    top_k choices (their capacity slots where the layer drops tokens), and with a capacity its
    share of the [tokens, experts x capacity] dispatch and combine masks, seq x top_k x capacity
    factor (0 for a dense model)."""
    dims = problem.dims
    if not dims.experts:
        return 0.0
    slots = dims.top_k * (dims.capacity_factor or 1.0)
    masks = problem.step.seq_len * slots if dims.capacity_factor else 0.0
    return slots * dims.shape.d_model + masks


def estimate(problem: PlanProblem, point: PlanPoint, fitted: Fitted = FITTED) -> MemoryEstimate:
    """The HBM per device `point` is estimated to need (see the module docstring)."""
    shape, layout = problem.dims.shape, point.layout
    policy = parse_remat(point.remat)
    weight_bytes = 2 if problem.step.weight_dtype == "bfloat16" else 4
    first_moment = 2 if problem.step.first_moment_dtype == "bfloat16" else 4
    shards = layout.parameter_shards
    per_shard = problem.parameters / shards
    weights = weight_bytes * per_shard
    state = state_bytes_per_parameter(problem.step.optimizer, first_moment, weight_bytes) * per_shard
    # Gradients in the weights' dtype and the bf16 copy the step computes with (none of bf16 weights).
    gradients = fitted.gradients * (weight_bytes + (BF16 if weight_bytes > 2 else 0.0)) * per_shard
    if point.accumulation > 1:
        gradients += 4.0 * per_shard
    layers = max(1, shape.n_layers)
    head = shape.vocab * shape.d_model
    layer_weights = max(0.0, problem.parameters - head) / layers
    # An expert axis splits what a layer gathers under capacity routing (its einsums' all-to-alls);
    # dropless routing's grouped matmuls gather every expert (compiler/grouped_matmul.py).
    experts_split = layout.expert if problem.moe != "dropless" else 1
    gathered = fitted.gathered * BF16 * (layer_weights / (layout.tensor * experts_split) + 2 * head / layout.tensor)
    step = problem.step
    tokens = step.global_batch / point.accumulation / layout.batch_shards * step.seq_len / layout.context
    widths = layer_widths(problem)
    kept, every = widths.named(policy, layout.tensor)
    block_input = 0.0 if policy.action(BLOCK_INPUT) == "offload" else shape.d_model / layout.tensor
    factor = fitted.activation_factor(policy.family)
    saved = factor * BF16 * tokens * (problem.dims.saved_block_inputs * block_input + layers * kept)
    # One layer recomputed and differentiated: its named tensors, its input and the residual's
    # gradient, and under context parallelism the keys and values gathered over the sequence.
    # A loop iteration of a layer pattern recomputes the pattern's layers together.
    per_iteration = max(1.0, (layers - problem.dims.unscanned) / problem.dims.scanned) if problem.dims.scanned else 1.0
    working = (
        BF16 * tokens * (every + 2 * shape.d_model / layout.tensor + widths.key_value * layout.context / layout.tensor)
    )
    working *= factor * per_iteration
    # A mixture of experts' routed rows: one layer's copies of its tokens, a d_model-wide row a
    # choice (times the capacity factor where it drops), and under capacity routing the
    # [tokens, experts x capacity] dispatch and combine masks (model/decoders/experts.py).
    # Dropless routing keeps more copies of a routed row than capacity routing's einsums: the rows
    # sorted by expert, the ragged matmuls' outputs and the unsorted result, with their cotangents.
    routing = fitted.dispatch + (0.0 if problem.dims.capacity_factor else fitted.dropless)
    working += routing * BF16 * tokens * moe_dispatch_width(problem)
    # Lookup tables besides the token embedding (per-layer inputs): the gradient of a lookup is
    # scattered into a whole bf16 table on every device before its all-reduce, and the compiled
    # step holds two such tables at its peak (Gemma 4 E2B's buffer assignment); the per-layer
    # inputs a token reads stay live for the backward, in bf16 with three fp32 buffers beside.
    dims = problem.dims
    side = fitted.side_tables * (
        2 * BF16 * dims.side_table_parameters / layout.tensor + (BF16 + 3 * 4.0) * tokens * dims.side_table_width
    )
    logits = fitted.logits * tokens / problem.step.vocab_tiling * shape.vocab / layout.tensor
    if layout.fsdp <= WINDOWED_FSDP:
        # The windowed program holds the logits' cotangent (bf16) through the backward loop
        # (Llama 3.1 8B on v6e-32: bf16[3, 8192, 128256] live beside the loop; on v6e-64 not).
        logits += fitted.held_cotangent * BF16 * tokens / problem.step.vocab_tiling * shape.vocab / layout.tensor
    return MemoryEstimate(weights, state, gradients, gathered + side, saved, working, logits)


def estimate_record(problem: PlanProblem, point: PlanPoint) -> dict[str, float]:
    """plan.json's `memory_estimate` of a point: each term in bytes, the total and the HBM limit."""
    return {**estimate(problem, point).terms(), "limit": problem.hbm}


def estimate_text(record: dict[str, float] | None) -> str:
    """'est 84.1 GiB / 95.7 GiB' of a plan's `memory_estimate` ("" without one)."""
    if not record:
        return ""
    return f"est {record['total'] / 2**30:.1f} GiB / {record['limit'] / 2**30:.1f} GiB"


__all__ = [
    "FITTED",
    "estimate_record",
    "estimate_text",
    "FIT_MARGIN",
    "WINDOWED_FSDP",
    "Fitted",
    "LayerWidths",
    "MemoryEstimate",
    "estimate",
    "layer_widths",
    "moe_dispatch_width",
]
