"""Top operators by self time, from torch.profiler over a few steps (never the timed ones)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tpu_tuner.devices.base import Backend

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OperatorTime:
    """One operator's share of the profiled steps."""

    name: str
    calls_per_step: float
    self_ms_per_step: float
    share: float  # of all operators' self time


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
