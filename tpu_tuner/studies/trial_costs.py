"""Where a measured trial's wall time went: the record keys (trials.csv's columns) and the split.

Beside `records.COMPILE_S`, a measured trial's `records.TRIAL_WALL_S` splits into its worker's
start-up (as the parent saw it: process start to the worker's READY, 0 on a warm worker), its
steps at their steady speed (warm-up beyond the compile, and the timed steps) and the rest, the
overhead (the reference and the accuracy check, the memory estimate, the model's build, re-timing,
the pipe), of which the worker tells apart the reference's and the baseline's outputs
(`REFERENCE_S`: a process comparing settings does not compute them), the memory estimate, the
build and the accuracy comparison (`PHASE_KEYS`). Issue 56: on a TPU v5e chip a worker's start
was about 15-20 s, and a Llama-class trial in a fresh worker had 78 s of overhead; issue 68: a
warm worker's Llama-class trial still had 14 s beyond its compile and steps, not told apart.
"""

from __future__ import annotations

from typing import Any

from tpu_tuner.execution.measurement import EarlyStop, Measurement
from tpu_tuner.studies.records import BUILD_S, ESTIMATE_S, JUDGE_S, OVERHEAD_S, REFERENCE_S, STEPS_S, WORKER_START_S

# Parts of the overhead a measurement tells apart (studies/records.py).
PHASE_KEYS = (REFERENCE_S, ESTIMATE_S, BUILD_S, JUDGE_S)
# trials.csv's columns, in order.
COST_KEYS = (WORKER_START_S, STEPS_S, OVERHEAD_S, *PHASE_KEYS)


def cost_keys(value: Any, wall_s: float, start_s: float | None) -> dict[str, float | None]:
    """Where a trial's `wall_s` went (`COST_KEYS`), from what its worker measured (`value`: a
    `Measurement` or an `EarlyStop`; anything else, a failure, has no cost split) and its
    worker's start-up as the parent saw it (`start_s`; None: not told apart, so in the overhead)."""
    reference: dict[str, float | None] = {}
    if isinstance(value, Measurement):
        compile_s = value.compile_seconds
        reference = {
            REFERENCE_S: value.reference_seconds,
            ESTIMATE_S: value.estimate_seconds,
            BUILD_S: value.build_seconds,
            JUDGE_S: value.judge_seconds,
        }
        # The first call and warm-up beyond the compile ran at the steady speed, as the timed steps
        # (each sample a block of `steps_per_sample` steps: execution/timer.py).
        timed = sum(value.samples) * value.steps_per_sample
        steps = max(0.0, value.first_call_seconds + value.warmup_seconds - compile_s) + timed
    elif isinstance(value, EarlyStop):
        compile_s = value.compile_seconds
        steps = max(0.0, value.first_call_seconds - compile_s) + sum(value.steps)
    else:
        return {}
    start = start_s or 0.0
    return {
        WORKER_START_S: start_s,
        STEPS_S: steps,
        OVERHEAD_S: max(0.0, wall_s - start - compile_s - steps),
        **reference,
    }


__all__ = ["COST_KEYS", "OVERHEAD_S", "PHASE_KEYS", "REFERENCE_S", "STEPS_S", "WORKER_START_S", "cost_keys"]
