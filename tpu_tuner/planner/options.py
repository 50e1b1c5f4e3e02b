"""`tpu-tune plan`'s options: the slice, the batch, the enumeration or the search, the study.

Immutable: a run derives what it needs (the folder's storage and compiler log) with
`dataclasses.replace`; the CLI reads the defaults from here."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tpu_tuner.metrics.flops import AttentionConvention
from tpu_tuner.model.layouts import Layout
from tpu_tuner.planner.calibration import calibrated_cost_model
from tpu_tuner.planner.compile_pool import default_workers
from tpu_tuner.planner.predict import CostModel
from tpu_tuner.planner.space import DEFAULT_ACCUMULATIONS, DEFAULT_CONTEXTS, DEFAULT_REMATS, PlanSpace


@dataclass(frozen=True)
class PlanOptions:
    """What to plan and how: the layout enumeration, or with `budget` (or the exhaustive sampler)
    the search over the joint space."""

    topology: str
    slices: int = 1  # slices of `topology` joined by DCN (multi-slice; docs/planner.md, "The whole mesh")
    global_batch: int | None = None
    seq_len: int | None = None
    preset: str | None = None
    remat: str = "full"  # a policy as remat.parse_remat reads it: "full", "save_qkv_proj", "custom:...", ...
    accumulation: int = 1  # micro-batches a step (gradient accumulation)
    first_moment_dtype: str = "float32"  # AdamW's first moment: "float32" or "bfloat16" (MaxText's mu_dtype)
    optimizer: str = "adamw"  # MaxText's opt_type: "adamw" or "sgd" (no state a parameter; optimizer.py)
    # The step's precision (docs/planner.md, "Precision of the step"): the master weights' storage
    # (MaxText's weight_dtype; its mu_dtype follows it when unset: the CLI does that, here it is
    # first_moment_dtype) and the blocks' matmuls: None (bf16), "int8" or "fp8" (MaxText's
    # quantization "int8" / "fp8_full").
    weight_dtype: str = "float32"
    quantization: str | None = None
    vocab_tiling: int = 1  # the loss's logits this many slices of the sequence at a time (MaxText's num_vocab_tiling)
    attention: AttentionConvention = "full"  # MFU convention: "full" or "causal"
    max_layouts: int = 10
    layouts: list[Layout] | None = None  # explicit layouts instead of the enumeration
    workers: int = field(default_factory=default_workers)  # compiler processes at once
    fast_compile: bool = False  # program.FAST_COMPILE_OPTIONS: quicker, but temporaries overstated
    log_file: Path | None = None  # the compiler processes' output (libtpu's logs); None: the terminal
    cost_model: CostModel = field(default_factory=calibrated_cost_model)  # fitted to the published rows
    # The search (planner/search.py): with a budget, Optuna picks `budget` points of the joint
    # space to compile instead of the layout enumeration.
    budget: int | None = None
    space: PlanSpace | None = None  # None: space.default_space with the three below
    remats: tuple[str, ...] = DEFAULT_REMATS
    accumulations: tuple[int, ...] = DEFAULT_ACCUMULATIONS
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    sampler: str = "tpe"  # "tpe", "random" or "exhaustive" (every valid point, in order)
    seed: int = 0
    study: str | None = None  # the Optuna study's name; None: one derived from the plan's inputs
    storage: str | None = None  # an Optuna storage URL; None: in memory (plan_to_folder gives one)


__all__ = ["PlanOptions"]
