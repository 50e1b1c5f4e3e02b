"""Top operators by self time, and the device's busy time, from torch.profiler over a few steps
(never the timed ones)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd import DeviceType

from tpu_tuner.devices.base import Backend

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OperatorTime:
    """One operator's share of the profiled steps."""

    name: str
    calls_per_step: float
    self_ms_per_step: float
    share: float  # of all operators' self time


@dataclass(frozen=True)
class DeviceBusy:
    """The device's busy time per profiled step, from the device events of a profiler trace."""

    seconds_per_step: float
    events: int  # device events whose intervals were merged
    method: str  # how it was measured, for the profile report


# torch.optim wraps every optimizer's step in a profiler range of this prefix
# (`Optimizer.step#AdamW.step`): its inclusive time is the whole update, whatever kernels it runs.
OPTIMIZER_STEP_RANGE = "Optimizer.step#"


def top_operators(
    step: Callable[[], Any],
    backend: Backend,
    steps: int,
    top: int,
    events_out: list[Any] | None = None,
    shares_out: dict[str, float] | None = None,
) -> list[OperatorTime]:
    """Profile `steps` steps and return the `top` operators by self time per step.

    `events_out`, if given, receives the raw profiler events (with their call tree), for the
    check of operators without a FLOP formula (`profiling/uncounted.py`). `shares_out`, if given, receives
    ``optimizer_step``: the optimizer update's share of all operators' self time, from its
    profiler range (an AdamW for-loop is hundreds of small ``mul_`` / ``lerp_`` calls, none of
    them in the top operators: docs/profiling.md).
    """
    activities = backend.profiler_activities()
    use_device = any(a != torch.profiler.ProfilerActivity.CPU for a in activities)
    with torch.profiler.profile(activities=activities, experimental_config=backend.profiler_config()) as prof:
        for _ in range(steps):
            step()
        backend.synchronize()
    if events_out is not None:
        events_out.extend(prof.events())
    averages = prof.key_averages()
    if use_device and not any(event.self_device_time_total > 0 for event in averages):
        # A device tracer that ties no time to operators (unverified for TorchTPU's): host time,
        # said so, rather than an empty table.
        log.warning("the device profiler attributed no time to operators; the table shows host time")
        use_device = False
    rows = []
    for event in averages:
        # Device time where the device reports it (CUDA); host self time otherwise, which on a
        # CPU is where the work runs.
        self_us = event.self_device_time_total if use_device else event.self_cpu_time_total
        if self_us > 0:
            rows.append((event.key, event.count, self_us))
    total = sum(r[2] for r in rows) or 1.0
    if shares_out is not None:
        update_us = sum(
            (e.device_time_total if use_device else e.cpu_time_total)
            for e in averages
            if e.key.startswith(OPTIMIZER_STEP_RANGE)
        )
        shares_out["optimizer_step"] = min(1.0, update_us / total)
    rows.sort(key=lambda r: r[2], reverse=True)
    return [
        OperatorTime(
            name=name,
            calls_per_step=count / steps,
            self_ms_per_step=self_us / 1000 / steps,
            share=self_us / total,
        )
        for name, count, self_us in rows[:top]
    ]


def device_busy(events: Sequence[Any], steps: int) -> DeviceBusy | None:
    """The device's busy time per step: the union of the trace's device-side event intervals
    (CUDA kernels and copies, TorchTPU's PrivateUse1 events), overlaps counted once, over `steps`.

    None where the trace holds no device events (a CPU run: host events only). User annotations
    mirrored onto the device timeline span gaps between kernels, so they never count as busy.
    """
    intervals = []
    kinds = set()
    for event in events:
        kind = getattr(event, "device_type", DeviceType.CPU)
        if kind == DeviceType.CPU or getattr(event, "is_user_annotation", False):
            continue
        if "annotation" in str(getattr(event, "activity_type", "") or "").lower():
            continue
        start, end = event.time_range.start, event.time_range.end
        if end > start:
            intervals.append((start, end))
            kinds.add(getattr(kind, "name", str(kind)))
    if not intervals or steps <= 0:
        return None
    intervals.sort()
    busy_us = 0.0
    current_start, current_end = intervals[0]
    for start, end in intervals[1:]:
        if start > current_end:  # a gap: close the merged interval
            busy_us += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    busy_us += current_end - current_start
    method = (
        f"union of {len(intervals):,} {'/'.join(sorted(kinds))} device-event intervals in the torch.profiler "
        f"trace (overlaps counted once), over {steps} profiled step{'s' if steps != 1 else ''}"
    )
    return DeviceBusy(seconds_per_step=busy_us * 1e-6 / steps, events=len(intervals), method=method)
