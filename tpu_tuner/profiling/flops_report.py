"""A profiled step's FLOPs as the profile reports them: the counted FLOPs, the model FLOPs and
the formula they come from, and the operators that worked without a FLOP formula (which make an
MFU resting on counted FLOPs a lower bound)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from tpu_tuner.metrics.flops import AttentionConvention, matmul_parameters, transformer_model_flops
from tpu_tuner.model.workloads.workload import Workload
from tpu_tuner.profiling.settings import ProfilerSettings
from tpu_tuner.profiling.uncounted import UncountedOp, describe, uncounted_operators

COUNTED_FORMULA = "counted FLOPs"  # how a model-FLOPs formula that is the counted figure starts


@dataclass(frozen=True)
class FlopsReport:
    """Counted FLOPs and model FLOPs of one step, with the formula and convention named."""

    counted_per_step: int
    counted_by_op: dict[str, int]
    model_per_step: float
    model_formula: str
    attention_convention: str
    matmul_parameters: int
    total_parameters: int
    bytes_unfused_per_step: int
    aten_ops_per_step: int
    # Operators that did work with no FLOP formula, with their share of the profiled time.
    uncounted: list[UncountedOp] = field(default_factory=list)


def flops_report(
    workload: Workload,
    model: torch.nn.Module,
    counted: Any,
    batch_size: int | None,
    seq_len: int | None,
    convention: AttentionConvention,
) -> FlopsReport:
    """The step's FLOPs report: `counted` (metrics.flops.count_step's result) and the model FLOPs
    of the workload's own formula, the transformer formula, or else the counted figure."""
    n_matmul = matmul_parameters(model)
    total_params = sum(p.numel() for p in model.parameters())
    if workload.model_flops is not None:
        model_flops = float(workload.model_flops(batch_size, seq_len, workload.is_training))
        formula, attention = "model_flops() of the workload file (user override)", "as the workload defines it"
    elif workload.transformer is not None and batch_size and seq_len:
        estimate = transformer_model_flops(
            n_matmul, workload.transformer, batch_size, seq_len, workload.is_training, convention
        )
        model_flops, formula, attention = estimate.per_step, estimate.formula, estimate.convention
    else:
        # No architecture to apply a formula to (a CNN, an MLP): the counted FLOPs are the model's.
        model_flops = float(counted.total)
        formula = f"{COUNTED_FORMULA} (FlopCounterMode); no transformer shape declared for the 6N formula"
        attention = "not applicable (no attention declared)"
    return FlopsReport(
        counted_per_step=counted.total,
        counted_by_op=counted.by_op,
        model_per_step=model_flops,
        model_formula=formula,
        attention_convention=attention,
        matmul_parameters=n_matmul,
        total_parameters=total_params,
        bytes_unfused_per_step=counted.bytes_unfused,
        aten_ops_per_step=counted.aten_ops,
    )


def with_uncounted(
    flops: FlopsReport,
    workload: Workload,
    events: list[Any],
    backend: Any,
    settings: ProfilerSettings,
    warnings: list[str],
) -> tuple[FlopsReport, bool]:
    """Record the operators that worked without a FLOP formula; the MFU is a lower bound when it
    rests on counted FLOPs (no formula, no user override) and such an operator took a share."""
    use_device = any(a != torch.profiler.ProfilerActivity.CPU for a in backend.profiler_activities())
    uncounted = uncounted_operators(events, settings.profiled_steps, use_device, settings.uncounted_share_min)
    if not uncounted:
        return flops, False
    lower_bound = flops.model_formula.startswith(COUNTED_FORMULA)
    warnings.append(
        describe(uncounted)
        + (
            "; the counted FLOPs miss their work, so the MFU is a lower bound"
            if lower_bound
            else "; the counted FLOPs miss their work (the model FLOPs come from a formula)"
        )
    )
    return dataclasses.replace(flops, uncounted=uncounted), lower_bound
