"""A training step too large for the device, fitted to it before it is profiled (issue 68, item 4).

The meta-device estimate sizes the step as the user wrote it. Where that exceeds the device's
memory, a tuning run does not refuse a training step outright: it tries the memory agent's
settings in the order a user would (every repeated block checkpointed, then that with 2 and 4
micro-batches), each estimated on fake tensors (execution/memory_estimate.py), and profiles the
first that fits with room for the estimate's error. That setting is the run's baseline: the search,
the race and the verification start from it, and the fp32 reference takes its memory knobs (they
change what the step keeps, not what it computes). JAX programs of this size run with full remat
for the same reason. `tpu-tune profile` (no `fit`) still refuses with the estimate.

The estimate can be short of what a device holds (a 335M decoder's fp32 baseline ran out of a v5e
chip's memory at warm-up: docs/torchtpu.md). A tuning run then profiles again in a fresh worker
with the failures so far (`ran_out`, one line a profile that ran out), and each profile takes the
next step of one sequence, the same in every attempt (the estimates are deterministic): the step
as given where its estimate fits, then each setting of the ladder whose estimate fits.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.units import binary_bytes
from tpu_tuner.devices import DeviceInfo
from tpu_tuner.devices.base import Backend
from tpu_tuner.execution.memory_estimate import MemoryEstimate, estimate_step_memory
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.metrics.estimate import StepEstimate, check_budget, estimate_step
from tpu_tuner.model.workloads.workload import Workload
from tpu_tuner.profiling.settings import ProfilerSettings

log = logging.getLogger(__name__)

# The memory agent's settings, least change first: what each adds to the user's step.
LADDER: tuple[dict[str, str], ...] = (
    {"activation_checkpointing": "blocks"},
    {"activation_checkpointing": "blocks", "micro_batches": "2"},
    {"activation_checkpointing": "blocks", "micro_batches": "4"},
)
# A fitted setting's fake-tensor estimate must leave this share of the device free: measured
# estimates were off their peaks by up to a fifth on the chip (docs/knobs.md, memory estimates).
HEADROOM = 0.9
# How the profile's warning of a fitted step begins: report.md quotes that warning.
FITTED_NOTE = "the step as given needs"


@dataclass(frozen=True)
class Fitted:
    """The setting a too-large step is profiled and tuned from: `values`, the knobs it adds."""

    candidate: Candidate
    values: dict[str, str]
    note: str
    estimate: MemoryEstimate  # its fake-tensor estimate, the profile's own


def estimate_or_fit(
    workload: Workload,
    backend: Backend,
    candidate: Candidate,
    info: DeviceInfo,
    sizes: tuple[int | None, int | None],
    settings: ProfilerSettings,
    fit: bool,
    ran_out: tuple[str, ...] = (),
) -> tuple[StepEstimate | None, Fitted | None]:
    """Size the step on the meta device; refuse it (one line, with the estimate) when it cannot fit
    in memory or in the time budget, unless `fit` and a setting of `LADDER` fits (`Fitted`); with
    `ran_out` (one line a profile that ran out of device memory) the sequence goes on past as many
    of its steps. No estimate where the meta pass is impossible."""
    batch_size, seq_len = sizes
    estimate = estimate_step(workload, batch_size, seq_len)
    if estimate is None:
        return None, None
    available = backend.available_memory_bytes(info.memory_bytes)
    peak = max(info.peak.flops_per_s.values(), default=None)
    seconds = estimate.seconds(peak, info.peak.memory_bytes_per_s)
    log.info(
        "meta-device estimate: %s; %s s per step at the device's peak",
        estimate.describe(),
        f"{seconds:.3g}" if seconds is not None else "n/a",
    )
    fitted = None
    fits_as_given = available is not None and estimate.memory_bytes <= available
    if fit and workload.is_training and available is not None and (ran_out or not fits_as_given):
        # The ladder's settings that fit to pass over: those the earlier profiles ran out under
        # (the first of them was the step as given where its estimate fits).
        skip = len(ran_out) - 1 if fits_as_given else len(ran_out)
        fitted = fit_to_memory(workload, backend, candidate, available, sizes, estimate, ran_out, skip)
        if fitted is None and ran_out:
            raise UserInputError(
                f"the step ran out of device memory in {len(ran_out)} profile(s), as given or under the memory "
                f"agent's settings that fit by estimate (the last: {ran_out[-1][:160]}); "
                "pass --batch-size to shrink it",
                workload.source,
            )
        if fitted is None:
            raise UserInputError(
                f"one step needs ~{binary_bytes(estimate.memory_bytes)} (estimated on the meta device), "
                f"{binary_bytes(available)} available, and neither checkpointed blocks nor 2 or 4 "
                "micro-batches fit it (estimated on fake tensors); pass --batch-size to shrink it",
                workload.source,
            )
    memory_checked = None if fitted else available
    check_budget(estimate, memory_checked, seconds, settings.max_step_seconds, workload.source, resizable=True)
    return estimate, fitted


def fit_to_memory(
    workload: Workload,
    backend: Backend,
    candidate: Candidate,
    available_bytes: int,
    sizes: tuple[int | None, int | None],
    estimate: StepEstimate,
    ran_out: tuple[str, ...] = (),
    skip: int = 0,
) -> Fitted | None:
    """The first setting of `LADDER` (on top of `candidate`) whose fake-tensor estimate leaves
    `HEADROOM` of `available_bytes`, past the first `skip` such settings (they ran out of device
    memory when measured, `ran_out` says how); None where none is left."""
    for values in LADDER:
        trial = Candidate({**candidate.to_dict(), **values})
        fake = estimate_step_memory(workload, backend, trial, *sizes)
        # The step's own tensors against what is free now (a CPU's heap model and the process's
        # holdings are the measured peak's terms, already out of `available_bytes`).
        log.info("fitting to memory: %s estimated at %s", trial.describe(), fake.step_bytes or fake.reason)
        if fake.step_bytes is None or fake.step_bytes > HEADROOM * available_bytes:
            continue
        if skip > 0:
            skip -= 1  # it fits by estimate, and ran out when measured
            continue
        needs = (
            f"more than the device's {binary_bytes(available_bytes)}: {len(ran_out)} profile(s) ran out of "
            f"device memory (the first: {ran_out[0][:160]}; the step as given estimated at "
            f"~{binary_bytes(estimate.memory_bytes)} on the meta device)"
            if ran_out
            else f"~{binary_bytes(estimate.memory_bytes)} (meta device), {binary_bytes(available_bytes)} available"
        )
        note = (
            f"{FITTED_NOTE} {needs}: the baseline is {trial.describe()}, "
            f"estimated at {binary_bytes(fake.step_bytes)} on fake tensors, the first of the "
            f"memory agent's settings that {'ran' if ran_out else 'fits'}"
        )
        return Fitted(trial, dict(values), note, fake)
    return None
