"""The calibration rows, built from the published runs (benchmarks/planner/published_runs.toml).

Each current (not superseded), non-quantized run whose recipe the planner can express exactly
becomes one `Row`: the run's shape as an inline generic-decoder spec (tpu_tuner/model/decoders/decoder_shape.py),
its slice, its mesh, its remat policy as MaxText's per-tensor choices, its per-device batch, its
optimizer (AdamW, or SGD), first-moment dtype and its FLOPs convention. A run the planner cannot
express is left out with the reason (`excluded`), never approximated: the fit would otherwise learn the approximation.

Sources of every row: docs/published-runs.md (MaxText, https://github.com/AI-Hypercomputer/maxtext,
and tpu-recipes, https://github.com/AI-Hypercomputer/tpu-recipes, at the commits the file cites).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_tuner.model.meshes.layouts import Layout
from tpu_tuner.planner.compiler.remat import parse_remat

PUBLISHED = Path(__file__).resolve().parent / "published_runs.toml"

# MaxText's FLOPs conventions (docs/published-runs.md) as the planner's --attention: A and C count
# causal attention as half of the full score matrix, A1 and B count it in full. A0 (MaxText before
# 2023-06-02) counted no attention at all, which no planner convention does: "none" is compiled
# under "causal" and that attention term taken out of the row's model FLOPs
# (benchmarks/planner/plan_calibration.py, `compile_row`).
ATTENTION_OF_CONVENTION = {"A0": "none", "A1": "full", "A": "causal", "B": "full", "C": "causal"}
# MaxText's quantization settings as the planner's --quantization (docs/planner.md, "Precision of
# the step"): AQT int8, and Qwix fp8_full. Such runs' MFU is against the bf16 peak, as the plan's is.
QUANTIZATION = {"none": None, "int8": "int8", "fp8_full": "fp8"}
# MaxText's opt_type as the planner's --optimizer (MaxText's optimizers.py, get_optimizer). adam_pax
# is Adam with decoupled weight decay written after Pax: the same two moments and elementwise
# update as AdamW, so it compiles as AdamW does. The 2023 v4 runs used optax.adam: the same two fp32
# moments, without the decay's one elementwise multiply-add per weight (no state, no memory). sgd is
# optax.sgd without momentum: no state a parameter (tpu_tuner/planner/compiler/optimizer.py).
OPTIMIZER_OF = {"adamw": "adamw", "adam_pax": "adamw", "adam": "adamw", "sgd": "sgd"}
# Slices whose chip count has no standard cube in the planner's table: their physical shape
# (v4-384 is 4x4x12, https://cloud.google.com/tpu/docs/v4 "Topologies").
_NON_STANDARD = {"v4-384": "v4:4x4x12"}
# Mesh axes the planner's layouts have no axis for (docs/planner.md, "The whole mesh").
_UNSUPPORTED_AXES = ("ici_sequence", "ici_pipeline", "dcn_tensor", "dcn_expert", "dcn_pipeline")


@dataclass(frozen=True)
class Row:
    """One published run as the planner compiles it."""

    id: str
    spec: str  # an inline decoder shape: "decoder:vocab=...,d_model=..."
    topology: str  # as parse_topology reads it
    generation: str
    seq: int
    global_batch: int
    per_device_batch: float
    layout: Layout
    remat: str  # remat.parse_remat's syntax
    remat_family: str  # full / minimal / offload / device (the custom policies by what they keep)
    attention: str  # the MFU convention: "full", "causal" or "none" (no attention term: A0)
    mu_dtype: str | None  # AdamW's first moment's dtype; None where the optimizer keeps no moments
    optimizer: str  # the planner's --optimizer (OPTIMIZER_OF)
    published_mfu: float
    vocab_tiling: int  # MaxText's num_vocab_tiling (1: the whole step's logits at once)
    slices: int  # slices joined by DCN (MaxText's num_slices)
    weight_dtype: str  # the master weights' storage (MaxText's weight_dtype)
    quantization: str | None  # the planner's --quantization (QUANTIZATION)
    in_calibration_before: bool  # one of the seven rows the planner was calibrated on before issue 29
    xla_flags: str = ""  # the recipe's XLA flags, compiled with where the file states them (--xla-flags)

    def plan_step(self, **changes: Any) -> Any:
        """The `PlanStep` of the published run (its batch, sequence, MFU convention, dtypes,
        optimizer, vocabulary tiling and 8-bit matmuls), with `changes` (remat=...)."""
        from tpu_tuner.planner.plans.plan_options import PlanStep

        settings = {
            "global_batch": self.global_batch,
            "seq_len": self.seq,
            "attention": "causal" if self.attention == "none" else self.attention,
            "first_moment_dtype": self.mu_dtype,
            "optimizer": self.optimizer,
            "vocab_tiling": self.vocab_tiling,
            "weight_dtype": self.weight_dtype,
            "quantization": self.quantization,
        }
        return PlanStep(**{**settings, **changes})


def moe_kind(run: dict[str, Any]) -> str:
    """A run's MoE kind as the error band compares rows (tpu_tuner/planner/prediction/band.py): "dense",
    "dropping" (a capacity factor: MaxText's einsum dispatch) or "dropless" (capacity_factor -1:
    sparse_matmul's grouped matmuls)."""
    if not run["experts"]:
        return "dense"
    return "dropless" if run["capacity_factor"] <= 0 else "dropping"


def load_runs(path: Path = PUBLISHED) -> list[dict[str, Any]]:
    """Every [[run]] of the published-runs file."""
    return tomllib.loads(path.read_text())["run"]


def why_not(run: dict[str, Any]) -> str | None:
    """Why the planner cannot compile `run` as published, or None when it can."""
    if run["superseded_by"]:
        return f"superseded by {run['superseded_by']}"
    if run["quantization"] not in QUANTIZATION:
        return f"quantization {run['quantization']!r}: not one the planner compiles (int8, fp8_full)"
    if run["dcn_data"] * run["dcn_fsdp"] != run["slices"]:
        return f"{run['slices']} slices but dcn_data x dcn_fsdp = {run['dcn_data'] * run['dcn_fsdp']}"
    axes = [a for a in _UNSUPPORTED_AXES if run[a] != 1]
    if axes:
        return f"mesh axis {', '.join(axes)}: not in the planner's layouts"
    pattern = attention_keys(run["attention_pattern"])
    if isinstance(pattern, str):
        return pattern
    if run["weight_dtype"] not in ("float32", "bfloat16"):
        return f"{run['weight_dtype']} weights: the planner keeps float32 or bfloat16 master weights"
    if run["opt_type"] not in OPTIMIZER_OF:
        return f"optimizer {run['opt_type']}: the planner compiles {' or '.join(sorted(set(OPTIMIZER_OF.values())))}"
    # The 2023 v4 runs' dot-product attention is compiled as the flash kernel: issue 29 measured
    # their verdicts both ways (benchmarks/planner/v4_2023_recipe.py, docs/planner.md "Calibration").
    if not run["attention"].startswith(("flash", "dot-product")):
        return f"attention {run['attention']!r}: not one the planner compiles"
    activations = run["mlp_activations"]
    if activations == ["sigmoid", "linear"] and _is_gpt_oss(run):
        return None  # MaxText's gpt_oss block reads these as its clamped SwiGLU (_gpt_oss_keys)
    if activations[0] not in ("silu", "gelu", "relu") or activations[1:] not in ([], ["linear"]):
        return f"MLP activations {activations}: not the generic decoder's"
    return None


def _is_gpt_oss(run: dict[str, Any]) -> bool:
    return run["model"].startswith("gpt-oss")


def _gpt_oss_keys(run: dict[str, Any]) -> dict[str, Any]:
    """gpt-oss's MoE as MaxText runs it (configs/models/gpt-oss-120b.yml and layers/moe.py at
    998b3e3): mlp_activations ["sigmoid", "linear"] in the gpt_oss decoder block are its clamped
    SwiGLU (limit mlp_activations_limit 7.0, alpha 1.702: the shape's defaults), routed_bias a bias
    on the router, mlp_bias biases on every expert's projections. The recipes' random routing
    (use_random_routing) changes which experts a token meets, not a matmul's size: the dropless
    grouped matmuls cost the same rows either way."""
    return {"activation": "clamped_swiglu", "router_bias": True, "expert_bias": True} if _is_gpt_oss(run) else {}


_LOCAL = re.compile(r"(\d+) local \(window (\d+)\) : 1 global")
_ALTERNATING = re.compile(r"alternating local \(window (\d+)\) / global")
_CHUNKED = re.compile(r"chunked causal \(chunk (\d+)\) on RoPE layers, global causal on every (\d+)\w* \(NoPE\) layer")
_GLOBAL_HEADS = re.compile(r"global layers head_dim (\d+)(?: with (\d+) KV heads)?")
# Gemma 4 E2B / E4B (model/decoders/shape_checks.py): per_layer_input, kv_shared_layers, double_wide_mlp.
_PER_LAYER_INPUTS = re.compile(r"per-layer inputs \((\d+)\)")
_KV_SHARED = re.compile(r"KV shared across the last (\d+) layers")
# What the generic decoder has no keys for (docs/planner.md, "Attention patterns"): nothing today.
_NOT_EXPRESSIBLE: dict[str, str] = {}


def attention_keys(pattern: str) -> dict[str, Any] | str:
    """The decoder-shape keys of a run's attention pattern as published_runs.toml words it, or
    why the decoder cannot express it."""
    lacking = [what for words, what in _NOT_EXPRESSIBLE.items() if words in pattern]
    if lacking:
        return f"attention {pattern!r}: {' and '.join(lacking)} are not expressible"
    keys: dict[str, Any] = {}
    if found := _LOCAL.search(pattern):
        keys |= {"sliding_window": int(found.group(2)), "global_every": int(found.group(1)) + 1}
    elif found := _ALTERNATING.search(pattern):
        keys |= {"sliding_window": int(found.group(1)), "global_every": 2}
    elif found := _CHUNKED.search(pattern):
        keys |= {"attention_chunk": int(found.group(1)), "global_every": int(found.group(2)), "global_rope": False}
    elif not pattern.startswith("global causal"):
        return f"attention {pattern!r}: not a pattern the planner reads"
    if found := _GLOBAL_HEADS.search(pattern):
        keys["global_head_dim"] = int(found.group(1))
        if found.group(2):
            keys["global_kv_heads"] = int(found.group(2))
    if "K=V shared projection" in pattern:
        keys["global_shared_kv"] = True
    if "attention sinks" in pattern:
        keys["attention_sinks"] = True
    if "q/k/v/o biases" in pattern:
        keys |= {"qkv_bias": True, "out_bias": True}
    if "QK-norm" in pattern:
        keys["qk_norm"] = True
    if found := _PER_LAYER_INPUTS.search(pattern):
        keys["per_layer_input"] = int(found.group(1))  # its table as wide as the vocabulary (per_layer_vocab 0)
    if found := _KV_SHARED.search(pattern):
        keys["kv_shared_layers"] = int(found.group(1))
    if "double-wide MLP in KV-shared layers" in pattern:
        keys["double_wide_mlp"] = True
    return keys


def _router(run: dict[str, Any]) -> dict[str, Any]:
    """The router of a run's family as MaxText's configs set it (the same matmuls whichever)."""
    if run["model"].startswith("llama4"):
        return {"router": "topk_sigmoid"}  # Llama 4: sigmoid of the chosen logits
    if run["model"].startswith(("qwen3", "gemma4")):
        return {"router": "softmax_topk", "norm_topk_prob": True}
    return {}


def remat_of(run: dict[str, Any]) -> tuple[str, str]:
    """The run's policy in remat.parse_remat's syntax, and its family."""
    if run["remat"] in ("full", "minimal"):
        policy = run["remat"]
    else:
        kept = {name: action for name, action in run["remat_tensors"].items() if action != "remat"}
        policy = "custom:" + ",".join(f"{name}={action}" for name, action in kept.items()) if kept else "full"
    return policy, parse_remat(policy).family


def spec_of(run: dict[str, Any]) -> str:
    """The run's model as an inline generic-decoder shape."""
    keys = {
        "vocab": run["vocab"],
        "d_model": run["d_model"],
        "layers": run["layers"],
        "heads": run["heads"],
        "kv_heads": run["kv_heads"],
        "head_dim": run["head_dim"],
        "mlp": run["mlp"],
        "gated": len(run["mlp_activations"]) == 2,
        "activation": run["mlp_activations"][0],
        "tied_embeddings": run["tied_embeddings"],
        "max_seq_len": max(8192, run["seq"]),
    }
    pattern = attention_keys(run["attention_pattern"])
    keys |= pattern if isinstance(pattern, dict) else {}
    if run["experts"]:
        keys |= {"experts": run["experts"], "top_k": run["top_k"], "moe_every": max(1, run["moe_layer_interval"])}
        # MaxText's sparse_matmul / megablox with capacity_factor -1: dropless grouped matmuls.
        keys |= (
            {"moe_routing": "dropless"} if run["capacity_factor"] <= 0 else {"capacity_factor": run["capacity_factor"]}
        )
        keys |= _router(run) | _gpt_oss_keys(run)
        if run["shared_experts"]:
            # One ungated MLP of shared_experts x its width: moe_mlp_dim, or mlp_dim for Gemma 4
            # (maxtext_utils.get_shared_expert_mlp_dim at df1b359), a whole multiple of moe_mlp.
            width = run["mlp"] if run["model"].startswith("gemma4") else run["moe_mlp"]
            keys["shared_experts"] = run["shared_experts"] * width // run["moe_mlp"]
        if run["moe_mlp"] and run["moe_mlp"] != run["mlp"]:
            keys["expert_mlp"] = run["moe_mlp"]
    return "decoder:" + ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in keys.items())


def row_of(run: dict[str, Any]) -> Row:
    """The planner's Row for an expressible run (see `why_not`)."""
    remat, family = remat_of(run)
    topology = run["topology"]
    if run["generation"] == "tpu7x":  # tpu-recipes write the physical shape: tpu7x-4x4x4
        topology = "tpu7x:" + topology.split("-", 1)[1]
    topology = _NON_STANDARD.get(topology, topology)
    devices = run["devices"]  # every slice's
    global_batch = run["per_device_batch"] * devices
    if global_batch != int(global_batch):
        raise ValueError(f"{run['id']}: per-device batch {run['per_device_batch']} x {devices} devices is not whole")
    return Row(
        id=run["id"],
        spec=spec_of(run),
        topology=topology,
        generation=run["generation"],
        seq=run["seq"],
        global_batch=int(global_batch),
        per_device_batch=run["per_device_batch"],
        layout=Layout(
            run["ici_data"] * run["dcn_data"],
            run["ici_fsdp"] * run["dcn_fsdp"],
            run["ici_tensor"],
            run["ici_context"],
            fsdp_transpose=run["ici_fsdp_transpose"],
            expert=run["ici_expert"],
            dcn_data=run["dcn_data"],
            dcn_fsdp=run["dcn_fsdp"],
        ),
        remat=remat,
        remat_family=family,
        attention=ATTENTION_OF_CONVENTION[run["flops_convention"]],
        mu_dtype=run["mu_dtype"] if OPTIMIZER_OF[run["opt_type"]] == "adamw" else None,
        optimizer=OPTIMIZER_OF[run["opt_type"]],
        published_mfu=run["mfu"],
        vocab_tiling=run.get("vocab_tiling", 1),
        weight_dtype=run["weight_dtype"],
        quantization=QUANTIZATION[run["quantization"]],
        slices=run["slices"],
        in_calibration_before=run["in_calibration"],
        xla_flags=run.get("xla_flags", ""),
    )


def published_rows(path: Path = PUBLISHED) -> tuple[list[Row], list[tuple[str, str]]]:
    """The expressible runs as Rows, and (id, reason) for every run left out."""
    rows, excluded = [], []
    for run in load_runs(path):
        reason = why_not(run)
        if reason:
            excluded.append((run["id"], reason))
        else:
            rows.append(row_of(run))
    return rows, excluded


__all__ = [
    "ATTENTION_OF_CONVENTION",
    "OPTIMIZER_OF",
    "PUBLISHED",
    "Row",
    "attention_keys",
    "load_runs",
    "published_rows",
    "remat_of",
    "row_of",
    "spec_of",
    "why_not",
]
