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
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.devices import DeviceInfo, get_backend
from tpu_tuner.devices.base import Backend
from tpu_tuner.execution.accuracy import REFERENCE
from tpu_tuner.execution.memory_estimate import estimate_step_memory
from tpu_tuner.execution.operators import OperatorTime, device_busy, top_operators
from tpu_tuner.execution.step import prepare_step, run_user_step
from tpu_tuner.execution.timer import StepClock, WarmupResult, time_steps, warm_up
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.model_traits import of_model
from tpu_tuner.metrics.estimate import StepEstimate
from tpu_tuner.metrics.flops import AttentionConvention, count_step
from tpu_tuner.metrics.mfu import MFU_CONVENTION, PeakChoice, achieved_flops_per_s, mfu, utilisation_by_dtype
from tpu_tuner.metrics.timing import TimingStats
from tpu_tuner.model.workloads.batch import leading_size
from tpu_tuner.model.workloads.input_dims import InputDims, read_dims
from tpu_tuner.model.workloads.loader import SEQ_LEN_REFUSED, load_workload
from tpu_tuner.model.workloads.profiled import ProfiledWorkload
from tpu_tuner.model.workloads.summary import input_signature
from tpu_tuner.model.workloads.workload import Workload
from tpu_tuner.profiling.flops_report import FlopsReport, flops_report, with_uncounted
from tpu_tuner.profiling.memory_fit import estimate_or_fit
from tpu_tuner.profiling.settings import ProfilerSettings
from tpu_tuner.profiling.verdict import Verdict, decide

log = logging.getLogger(__name__)

NO_DEVICE_EVENTS = (
    "not measured: the profiler trace holds no device events ({why}), so the verdict's overhead term "
    "is ops x the measured per-op dispatch cost"
)


@dataclass(frozen=True)
class MemoryReport:
    peak_bytes: int | None
    method: str
    # The peak estimated on fake tensors before the step ran (execution/memory_estimate.py), in
    # `peak_bytes`' terms, or why there is none; None in older profiles.
    estimated_peak_bytes: int | None = None
    estimate_note: str | None = None


@dataclass(frozen=True)
class Profile:
    """Everything the profiler measured; serialises to profile.json."""

    workload: ProfiledWorkload
    device: DeviceInfo
    candidate: Candidate
    peak_flops_per_s: float
    peak_dtype: str
    warmup: WarmupResult
    timing: TimingStats
    compiles_while_timing: dict[str, int]
    flops: FlopsReport
    achieved_flops_per_s: float
    mfu: float  # model FLOP/s over `peak_flops_per_s`, the fastest dtype's peak (MFU_CONVENTION)
    mfu_convention: str
    compute_dtype: str  # the dtype the candidate's matmuls run in
    utilisation_by_dtype: dict[str, float | None]  # achieved over each dtype's peak; None above it
    memory: MemoryReport
    operators: list[OperatorTime]
    operator_steps: int
    verdict: Verdict
    environment: dict[str, str]
    created: str
    warnings: list[str] = field(default_factory=list)
    # True when the MFU rests on counted FLOPs and an uncounted operator took a share of the step.
    mfu_is_lower_bound: bool = False
    estimate: StepEstimate | None = None  # the meta-device estimate made before running
    # A training step's optimizer update, as a share of profiled operator self time (its
    # profiler range, so every kernel of it counts); None for inference and older profiles.
    optimizer_share: float | None = None
    # The device's busy time per step (the union of its profiler events) and how it was
    # measured, or why not; both None in older profiles. The verdict's overhead term reads it.
    device_busy_seconds: float | None = None
    device_busy_method: str | None = None
    # The knobs a step too large for the device was profiled under (profiling/memory_fit.py): the
    # run's baseline carries them; empty where the step fits as given (and in older profiles).
    fitted_to_memory: dict[str, str] = field(default_factory=dict)

    def fp32_reference(self) -> dict[str, str] | None:
        """The accuracy guardrail's fp32 reference for a run from this profile: eager fp32 with the
        knobs the step was fitted to memory under (None: `accuracy.REFERENCE` as it is)."""
        return Candidate({**REFERENCE.to_dict(), **self.fitted_to_memory}).to_dict() if self.fitted_to_memory else None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["candidate"] = self.candidate.to_dict()  # knob values: a Candidate is no dataclass
        data["workload"] = self.workload.to_dict()  # profile.json's table, with the step's words
        return data

    def to_json(self) -> str:
        from tpu_tuner.core.plain_data import json_default

        return json.dumps(self.to_dict(), indent=2, default=json_default)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        """The inverse of `to_dict`: every nested figure rebuilt as its dataclass."""
        from tpu_tuner.core.plain_data import from_plain

        return from_plain(cls, data)

    @classmethod
    def from_json(cls, text: str) -> Profile:
        """A profile.json back into a Profile (raises ValueError or TypeError when malformed)."""
        return cls.from_dict(json.loads(text))


def profile(
    workload: Workload | str | Path,
    device: str | None = None,
    candidate: Candidate | None = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    attention_convention: AttentionConvention = "full",
    settings: ProfilerSettings | None = None,
    fit_memory: bool = False,
    ran_out: tuple[str, ...] = (),
) -> Profile:
    """Profile a workload (or a model file) on `device` (auto-detected when None). `fit_memory`: a
    training step too large for the device is profiled under the first memory setting that fits
    (profiling/memory_fit.py; the profile's `candidate` and `fitted_to_memory` say which), past
    the settings `ran_out` says ran out of device memory when measured (the step as given first)."""
    if not isinstance(workload, Workload):
        workload = load_workload(workload)
    _check_positive(batch_size, "batch size")
    _check_positive(seq_len, "sequence length")
    if workload.convention == "benchmark" and seq_len is not None:
        raise UserInputError(SEQ_LEN_REFUSED, workload.source)
    backend = get_backend(device)
    candidate = candidate or Candidate()
    settings = settings or ProfilerSettings.load()
    info = backend.info()
    dispatch_cost = backend.dispatch_seconds_per_op()
    requested = (batch_size, seq_len)  # the flags as given: the header says which sizes came from them
    batch_size = batch_size or workload.batch_size
    seq_len = seq_len or workload.seq_len
    warnings: list[str] = []
    estimate, fitted = estimate_or_fit(
        workload, backend, candidate, info, (batch_size, seq_len), settings, fit_memory, ran_out
    )
    if fitted is not None:
        candidate = fitted.candidate
        warnings.append(fitted.note)
    compute_dtype = candidate.compute_dtype(backend)
    deadline = time.monotonic() + settings.max_profile_seconds
    # Beside the measured peak (a fitted step's was made while fitting it).
    fake = fitted.estimate if fitted else estimate_step_memory(workload, backend, candidate, batch_size, seq_len)

    with candidate.process(backend):
        step = prepare_step(workload, backend, candidate, batch_size, seq_len)
        ran_batch_size = _ran_batch_size(workload, step.batch[0], batch_size)
        # What the search space is narrowed by (knobs/traits.py): read from the built model here,
        # where the file is imported; the parent only reads the profile.
        traits = of_model(step.model, workload.is_training, ran_batch_size)
        log.info("counting FLOPs of one eager %s", workload.step_kind)
        started = time.monotonic()
        counted = run_user_step(lambda: count_step(step.run_eager), workload, "the first step")
        settings = within_budget(settings, time.monotonic() - started, deadline, warnings)
        flops = flops_report(workload, step.model, counted, batch_size, seq_len, attention_convention)
        log.info("warming up %s", candidate.describe())
        warmup_min, warmup_max = settings.warmup_min_steps, settings.warmup_max_steps
        clock = StepClock.of(step, backend)
        warmup = run_user_step(
            lambda: warm_up(clock, warmup_min, warmup_max),
            workload,
            "warm-up",
        )
        if not warmup.settled:
            warnings.append(f"still compiling after {warmup.steps} warm-up steps")
        settings = within_budget(settings, _steady_seconds(warmup), deadline, warnings)
        backend.reset_peak_memory()
        log.info("timing at least %d steps", settings.timing_min_steps)
        timing, compiles_while_timing = time_steps(
            clock, settings.timing_min_steps, settings.timing_min_seconds, settings.timing_max_steps
        )
        peak_memory, memory_method = backend.peak_memory_bytes()
        if any(compiles_while_timing.values()):
            warnings.append(f"recompiled while timing: {compiles_while_timing}")
        events: list[Any] = []
        shares: dict[str, float] = {}
        operators = top_operators(step.run, backend, settings.profiled_steps, settings.top_operators, events, shares)
        busy = device_busy(events, settings.profiled_steps)
        flops, mfu_is_lower_bound = with_uncounted(flops, workload, events, backend, settings, warnings)

    # One MFU convention for every run: the fastest dtype's peak, never exceeded (docs/mfu.md).
    achieved = achieved_flops_per_s(flops.model_per_step, timing.median)
    verdict_flops = flops.counted_per_step or flops.model_per_step
    peak_choice = backend.mfu_peak(info.peak.flops_per_s, max(achieved, verdict_flops / timing.median))
    peak, peak_dtype = peak_choice.flops_per_s, peak_choice.dtype
    if peak_choice.note:
        warnings.append(peak_choice.note)
        info = _with_peak(backend.info(), peak_choice)  # the re-measured probe, or the raised peak
    verdict = decide(
        flops_per_step=verdict_flops,
        bytes_per_step=flops.bytes_unfused_per_step,
        step_seconds=timing.median,
        peak_flops=peak,
        peak_dtype=peak_dtype,
        memory_bytes_per_s=info.peak.memory_bytes_per_s,
        ops_per_step=flops.aten_ops_per_step,
        explained_share_min=settings.explained_share_min,
        dispatch_seconds_per_op=dispatch_cost,
        top_operators=[(op.name, op.share) for op in operators[:3]],
        step_cv=timing.robust_cv,  # one slow step among hundreds is no reason to doubt the verdict
        cv_max=settings.verdict_cv_max,
        device_busy_seconds=busy.seconds_per_step if busy else None,
    )
    if verdict.uncertain:
        warnings.append(
            f"step times spread too much for a verdict (robust CV {timing.robust_cv:.0%} > "
            f"{settings.verdict_cv_max:.0%}): other processes may be contending for the device"
        )
    return Profile(
        workload=ProfiledWorkload(
            name=workload.name,
            source=str(workload.source),
            convention=workload.convention,
            training=workload.is_training,
            batch_size=ran_batch_size,
            seq_len=seq_len,
            notes=tuple(workload.notes + _size_notes(workload, batch_size, ran_batch_size)),
            dims=_declared_dims(workload, batch_size, seq_len, requested),
            # The traits' own training flag is the workload's (both from workload.is_training).
            traits={key: value for key, value in traits.to_dict().items() if key != "training"},
        ),
        device=info,
        candidate=candidate,
        peak_flops_per_s=peak,
        peak_dtype=peak_dtype,
        warmup=warmup,
        timing=timing,
        compiles_while_timing=compiles_while_timing,
        flops=flops,
        achieved_flops_per_s=achieved,
        mfu=mfu(flops.model_per_step, timing.median, peak, devices=1),
        mfu_convention=MFU_CONVENTION,
        compute_dtype=compute_dtype,
        utilisation_by_dtype=utilisation_by_dtype(achieved, info.peak.flops_per_s),
        memory=MemoryReport(peak_memory, memory_method, fake.peak_bytes, fake.reason),
        operators=operators,
        operator_steps=settings.profiled_steps,
        optimizer_share=shares.get("optimizer_step") if workload.is_training else None,
        device_busy_seconds=busy.seconds_per_step if busy else None,
        device_busy_method=busy.method if busy else _no_busy_time(backend),
        verdict=verdict,
        environment={
            "python": platform.python_version(),
            "torch": torch.__version__,
            "platform": platform.platform(),
            "threads": str(torch.get_num_threads()),
        },
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        warnings=warnings,
        mfu_is_lower_bound=mfu_is_lower_bound,
        estimate=estimate,
        fitted_to_memory=fitted.values if fitted else {},
    )


def _no_busy_time(backend: Backend) -> str:
    """Why the device's busy time is missing: a host-only trace, or a device tracer that gave none."""
    if all(a == torch.profiler.ProfilerActivity.CPU for a in backend.profiler_activities()):
        return NO_DEVICE_EVENTS.format(why="the host runs the ops")
    log.warning("the device profiler traced no device events: the device's busy time is not measured")
    return NO_DEVICE_EVENTS.format(why="the device tracer recorded none")


def _with_peak(info: DeviceInfo, choice: PeakChoice) -> DeviceInfo:
    """`info` with its peak table raised to `choice` where the step beat every re-measured peak,
    so that trials measured against this profile start from the raised figure."""
    if not choice.raised_to_achieved:
        return info
    flops = {**info.peak.flops_per_s, choice.dtype: choice.flops_per_s}
    peak = dataclasses.replace(
        info.peak,
        flops_per_s=flops,
        source=info.peak.source + f"; {choice.dtype} raised to the baseline's achieved rate",
    )
    return dataclasses.replace(info, peak=peak)


def _check_positive(value: int | None, what: str) -> None:
    if value is not None and value <= 0:
        raise UserInputError(f"{what} must be a positive integer, got {value}")


def _declared_dims(
    workload: Workload, batch_size: int | None, seq_len: int | None, requested: tuple[int | None, int | None]
) -> InputDims | None:
    """Which input sizes are the batch and the sequence, as the file declares them (the report's
    header says them: a sequence-first recurrent model's 512 had read "batch 512"); `requested`:
    --batch-size and --seq-len as given (None: the file's own)."""
    try:
        return read_dims(workload, input_signature(workload, batch_size, seq_len), requested)
    except Exception:  # the header's words are never worth failing a profile for
        return None


def _ran_batch_size(workload: Workload, inputs: Any, batch_size: int | None) -> int | None:
    """The batch size that actually runs: what make_batch was called with (native files), or the
    leading size of the inputs get_inputs() made, after any resize (benchmark files)."""
    if workload.convention == "benchmark":
        return leading_size(inputs)
    return batch_size


def _size_notes(workload: Workload, requested: int | None, ran: int | None) -> list[str]:
    if workload.convention != "benchmark" or requested is None:
        return []
    return [
        f"--batch-size {requested}: dimension 0 of the get_inputs() tensors that shared the leading size "
        f"was resized (sliced or repeated) to {ran}"
    ]


def _steady_seconds(warmup: WarmupResult) -> float:
    """Seconds of one warm step: the warm-up steps after the first, else the first call."""
    if warmup.steps > 1:
        return max(0.0, warmup.seconds - warmup.first_call_seconds) / (warmup.steps - 1)
    return warmup.first_call_seconds


def within_budget(
    settings: ProfilerSettings, step_seconds: float, deadline: float, warnings: list[str]
) -> ProfilerSettings:
    """`settings` with warm-up, timed and profiled steps capped so that, at `step_seconds` a
    step, the rest of the profile ends by `deadline`; at least two warm-up steps, two timed
    steps and one profiled step still run. Says so in `warnings` when it caps anything."""
    remaining = deadline - time.monotonic()
    if step_seconds <= 0:
        return settings
    affordable = int(remaining / step_seconds)
    warmup_max = max(2, min(settings.warmup_max_steps, affordable // 4))
    timing_max = max(2, min(settings.timing_max_steps, affordable // 2))
    profiled = max(1, min(settings.profiled_steps, affordable // 8))
    capped = dataclasses.replace(
        settings,
        warmup_max_steps=warmup_max,
        warmup_min_steps=min(settings.warmup_min_steps, warmup_max),
        timing_max_steps=timing_max,
        timing_min_steps=min(settings.timing_min_steps, timing_max),
        profiled_steps=profiled,
    )
    if capped != settings:
        warnings[:] = [w for w in warnings if not w.startswith("time budget:")]  # keep the latest only
        warnings.append(
            f"time budget: steps take ~{step_seconds:.3g} s, so at most {warmup_max} warm-up, {timing_max} timed "
            f"and {profiled} profiled steps run, to end within [budget] max_profile_seconds "
            f"({settings.max_profile_seconds:.0f} s)"
        )
    return capped
