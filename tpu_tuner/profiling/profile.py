"""The profiler agent: one honest profile of a workload on a device.

Order matters: FLOPs are counted on one eager step (dispatch-level counters are slow and never
timed), then the candidate's step warms up until it stops compiling, then at least N steps are
timed with device sync, and last a few steps run under torch.profiler for the operator table.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from tpu_tuner.backends import DeviceInfo, get_backend
from tpu_tuner.candidate import Candidate
from tpu_tuner.errors import UserInputError
from tpu_tuner.loader import load_workload
from tpu_tuner.metrics.flops import AttentionConvention, count_step, matmul_parameters, transformer_model_flops
from tpu_tuner.metrics.mfu import achieved_flops_per_s, mfu
from tpu_tuner.metrics.timing import TimingStats
from tpu_tuner.profiling.operators import OperatorTime, top_operators
from tpu_tuner.profiling.settings import ProfilerSettings
from tpu_tuner.profiling.step import prepare_step, run_user_step
from tpu_tuner.profiling.timer import WarmupResult, time_steps, warm_up
from tpu_tuner.profiling.verdict import Verdict, decide
from tpu_tuner.workload import Workload

log = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class MemoryReport:
    peak_bytes: int | None
    method: str


@dataclass(frozen=True)
class Profile:
    """Everything the profiler measured; serialises to profile.json."""

    workload: dict[str, Any]
    device: DeviceInfo
    candidate: Candidate
    peak_flops_per_s: float
    peak_dtype: str
    warmup: WarmupResult
    timing: TimingStats
    compiles_while_timing: dict[str, int]
    flops: FlopsReport
    achieved_flops_per_s: float
    mfu: float
    memory: MemoryReport
    operators: list[OperatorTime]
    operator_steps: int
    verdict: Verdict
    environment: dict[str, str]
    created: str
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)


def profile(
    workload: Workload | str | Path,
    device: str | None = None,
    candidate: Candidate | None = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    attention_convention: AttentionConvention = "full",
    settings: ProfilerSettings | None = None,
) -> Profile:
    """Profile a workload (or a model file) on `device` (auto-detected when None)."""
    if not isinstance(workload, Workload):
        workload = load_workload(workload)
    _check_positive(batch_size, "batch size")
    _check_positive(seq_len, "sequence length")
    backend = get_backend(device)
    candidate = candidate or Candidate()
    settings = settings or ProfilerSettings.load()
    info = backend.info()
    peak_dtype_wanted = backend.compute_dtype(candidate)
    peak, peak_dtype = info.peak.flops_for(peak_dtype_wanted)
    batch_size = batch_size or workload.batch_size
    seq_len = seq_len or workload.seq_len
    warnings: list[str] = []
    if peak_dtype != peak_dtype_wanted:
        warnings.append(f"no {peak_dtype_wanted} peak for {info.name}; MFU uses the {peak_dtype} peak")

    with backend.applied(candidate):
        step = prepare_step(workload, backend, candidate, batch_size, seq_len)
        log.info("counting FLOPs of one eager %s", workload.step_kind)
        counted = run_user_step(lambda: count_step(step.run_eager), workload, "the first step")
        flops = _flops_report(workload, step.model, counted, batch_size, seq_len, attention_convention)
        log.info("warming up %s", candidate.describe())
        warmup = run_user_step(
            lambda: warm_up(step.run, backend, settings.warmup_min_steps, settings.warmup_max_steps),
            workload,
            "warm-up",
        )
        if not warmup.settled:
            warnings.append(f"still compiling after {warmup.steps} warm-up steps")
        backend.reset_peak_memory()
        log.info("timing at least %d steps", settings.timing_min_steps)
        timing, compiles_while_timing = time_steps(
            step.run, backend, settings.timing_min_steps, settings.timing_min_seconds, settings.timing_max_steps
        )
        peak_memory, memory_method = backend.peak_memory_bytes()
        if any(compiles_while_timing.values()):
            warnings.append(f"recompiled while timing: {compiles_while_timing}")
        operators = top_operators(step.run, backend, settings.profiled_steps, settings.top_operators)

    verdict = decide(
        flops_per_step=flops.counted_per_step or flops.model_per_step,
        bytes_per_step=flops.bytes_unfused_per_step,
        step_seconds=timing.median,
        peak_flops=peak,
        peak_dtype=peak_dtype,
        memory_bytes_per_s=info.peak.memory_bytes_per_s,
        ops_per_step=flops.aten_ops_per_step,
        explained_share_min=settings.explained_share_min,
    )
    return Profile(
        workload={
            "name": workload.name,
            "source": str(workload.source),
            "convention": workload.convention,
            "step": workload.step_kind,
            "batch_size": batch_size,
            "seq_len": seq_len,
            "notes": workload.notes,
        },
        device=info,
        candidate=candidate,
        peak_flops_per_s=peak,
        peak_dtype=peak_dtype,
        warmup=warmup,
        timing=timing,
        compiles_while_timing=compiles_while_timing,
        flops=flops,
        achieved_flops_per_s=achieved_flops_per_s(flops.model_per_step, timing.median),
        mfu=mfu(flops.model_per_step, timing.median, peak, devices=1),
        memory=MemoryReport(peak_memory, memory_method),
        operators=operators,
        operator_steps=settings.profiled_steps,
        verdict=verdict,
        environment={
            "python": platform.python_version(),
            "torch": torch.__version__,
            "platform": platform.platform(),
            "threads": str(torch.get_num_threads()),
        },
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        warnings=warnings,
    )


def _check_positive(value: int | None, what: str) -> None:
    if value is not None and value <= 0:
        raise UserInputError(f"{what} must be a positive integer, got {value}")


def _flops_report(
    workload: Workload,
    model: torch.nn.Module,
    counted: Any,
    batch_size: int | None,
    seq_len: int | None,
    convention: AttentionConvention,
) -> FlopsReport:
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
        formula = "counted FLOPs (FlopCounterMode); no transformer shape declared for the 6N formula"
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
