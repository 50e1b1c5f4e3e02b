"""The jobs a worker runs, as typed requests, and the typed results of those whose value is no
other type of its own (a `Measurement`, a `Profile`, a `WorkloadSummary`).

A request is pickled across the worker's pipe (or into a sharded trial's job file) as it is; the
worker looks up its job function by the request's type (`runner/jobs.py`). This module imports
nothing heavy: the parent builds requests before torch is imported.

A candidate travels as its dict (`Candidate.to_dict()`), the form a trial records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from tpu_tuner.metrics.flops import AttentionConvention
    from tpu_tuner.model.buckets.bucket_cost import ShapeCost
    from tpu_tuner.profiling.settings import ProfilerSettings


@dataclass(frozen=True)
class Request:
    """A worker job. `on_ranks`: it runs a layout, so a sharded trial runs it on every rank;
    `refusable`: the worker's TpuTuneError (a bad file, option or device) is the parent's own
    error, passed on as failure kind REFUSED; in a trial the same error is a failed trial."""

    on_ranks: ClassVar[bool] = False
    refusable: ClassVar[bool] = False


@dataclass(frozen=True)
class LoadRequest(Request):
    """Import and validate the file and describe it (a `WorkloadSummary`); the parent never imports it."""

    refusable: ClassVar[bool] = True
    batch_size: int | None = None
    seq_len: int | None = None
    sample_lengths: bool = True  # evaluate the file's sample_lengths()


@dataclass(frozen=True)
class ProfileRequest(Request):
    """Profile `candidate` (a `Profile`); `settings` None: the built-in profiler settings."""

    refusable: ClassVar[bool] = True
    candidate: dict[str, Any] = field(default_factory=dict)
    batch_size: int | None = None
    seq_len: int | None = None
    settings: ProfilerSettings | None = None
    attention_convention: AttentionConvention = "full"
    # A tuning run's baseline: a training step too large for the device is profiled under the
    # first memory setting that fits (profiling/memory_fit.py) rather than refused.
    fit_memory: bool = False
    # With fit_memory: the device's out-of-memory lines of the profiles before this one (the step as
    # given first, then each memory setting tried): the fit goes on past them.
    ran_out: tuple[str, ...] = ()


@dataclass(frozen=True)
class MeasureRequest(Request):
    """Warm up, check accuracy and time `candidate` (a `Measurement`, or an `EarlyStop`): MFU from
    `model_flops_per_step` and the profile's `peak_flops_per_s` (by dtype, one device's)."""

    on_ranks: ClassVar[bool] = True
    candidate: dict[str, Any] = field(default_factory=dict)
    batch_size: int | None = None
    seq_len: int | None = None
    settings: ProfilerSettings | None = None
    model_flops_per_step: float = 0.0
    peak_flops_per_s: dict[str, float] = field(default_factory=dict)
    # Stop early (an `EarlyStop`) once the trial's optimistic amortised step passes this, its
    # compile spread over `planned_steps` (execution/early_stop.py); None measures to the end.
    stop_above_s: float | None = None
    planned_steps: int = 5000
    # The study's memory limit (`tuning/search/memory_limit.py`): a step estimated above it is refused
    # unmeasured (execution/memory_estimate.py); None: the device's or the process's memory.
    memory_limit_bytes: int | None = None
    memory_limit_source: str = ""
    # The search's baseline (its candidate's dict): the accuracy guardrail judges a setting by how
    # much less accurate than it it is (execution/accuracy.py); None: against fp32 alone.
    baseline: dict[str, Any] | None = None
    # Where the run keeps the reference's and the baseline's outputs for every worker
    # (execution/reference_store.py); None: each worker computes its own.
    references_dir: str | None = None
    # The fp32 reference's candidate; None: eager, fp32 (accuracy.REFERENCE). A baseline fitted to
    # memory lends it its memory knobs: the reference must fit the device too.
    reference: dict[str, Any] | None = None


@dataclass(frozen=True)
class CompareRequest(Request):
    """Rounds `first_round` .. `first_round + rounds - 1` of the candidates timed interleaved (a
    `Comparison`); the steps built for them stay in the worker until the request marked `last`."""

    on_ranks: ClassVar[bool] = True
    candidates: list[dict[str, Any]] = field(default_factory=list)
    rounds: int = 1
    first_round: int = 0
    last: bool = True
    batch_size: int | None = None
    seq_len: int | None = None
    warmup_min_steps: int = 2
    warmup_max_steps: int = 20


@dataclass(frozen=True)
class Comparison:
    """Per candidate, one sample each round (seconds per step of a block read to its result:
    execution/timer.py); the compiles seen while comparing; each candidate's steps per sample."""

    samples: list[list[float]]
    compiles_while_comparing: dict[str, int]
    steps_per_sample: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class BucketCostsRequest(Request):
    """Compile cost of a new shape and steady step time at each of `lengths` (`BucketCosts`),
    after a throwaway compile at `warmup_length`."""

    candidate: dict[str, Any] = field(default_factory=dict)
    lengths: list[int] = field(default_factory=list)
    warmup_length: int = 1
    batch_size: int | None = None


@dataclass(frozen=True)
class BucketPoint:
    """One length's compile cost (first call minus a steady step) and steady step."""

    length: int
    compile_seconds: float
    step_seconds: float
    shape: ShapeCost | None = None  # how it was measured: the first step, the backend's counters


@dataclass(frozen=True)
class BucketCosts:
    """The cost of each length measured, in the order asked."""

    points: list[BucketPoint]
    device_name: str = ""  # the device they were measured on, by name (e.g. "TPU v5e")


@dataclass(frozen=True)
class BucketReplayRequest(Request):
    """Replay `stream` (one length per step) padded up to `bounds` (`BucketReplay`)."""

    candidate: dict[str, Any] = field(default_factory=dict)
    bounds: list[int] = field(default_factory=list)
    stream: list[int] = field(default_factory=list)
    warmup_length: int = 1
    batch_size: int | None = None


@dataclass(frozen=True)
class BucketReplay:
    """Each bound's compile cost (first use order), the stream's summed step time, its steps."""

    compile_seconds: dict[int, float]
    step_seconds: float
    steps: int
    shapes: list[ShapeCost] = field(default_factory=list)  # each bound's first use as measured, in order


@dataclass(frozen=True)
class ShardedStepRequest(Request):
    """The training step on `layout` ("DATAxFSDPxTENSOR"): `warmup_steps` steps, then `steps`
    timed ones (`ShardedStepTiming`); the trial's own step building and timing, on every rank."""

    on_ranks: ClassVar[bool] = True
    layout: str = "1x1x1"
    batch_size: int | None = None
    steps: int = 10
    warmup_steps: int = 2


@dataclass(frozen=True)
class ShardedStepTiming:
    """Per timed step the slowest rank's seconds; per rank its peak memory over the timed steps
    and the bytes of parameters and optimizer state it holds (local shards)."""

    step_seconds: list[float]
    peak_bytes: list[int]
    state_bytes: list[int]
    local_batch: int
