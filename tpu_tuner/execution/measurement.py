"""A `Measurement`: what one trial measured, or why it failed."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tpu_tuner.core.failures import FailureKind


@dataclass
class Measurement:
    """Step-time samples, compile cost, MFU, memory and accuracy of one candidate."""

    candidate: dict[str, Any]
    step_median: float
    step_p10: float
    step_p90: float
    samples: list[float]
    first_call_seconds: float
    warmup_seconds: float  # the warm-up steps after the first call
    compile_seconds: float
    compiles: dict[str, int]
    model_flops_per_step: float
    peak_flops_per_s: float
    peak_dtype: str
    mfu: float
    peak_memory_bytes: int | None
    accuracy_errors: dict[str, float]
    warnings: list[str] = field(default_factory=list)
    # The dtype the candidate's matmuls ran in; MFU itself always uses the fastest dtype's peak
    # (`peak_dtype`). None in older measurements that did not record it.
    compute_dtype: str | None = None
    # The peak estimated on fake tensors before the step ran (execution/memory_estimate.py), in
    # `peak_memory_bytes`'s terms, or why there is none.
    estimated_peak_bytes: int | None = None
    estimate_note: str | None = None

    @property
    def estimate_error(self) -> float | None:
        """The estimate's error relative to the measured peak (+0.05: 5% high), where both exist."""
        if self.estimated_peak_bytes is None or not self.peak_memory_bytes:
            return None
        return self.estimated_peak_bytes / self.peak_memory_bytes - 1

    @property
    def accuracy_error(self) -> float:
        """The largest relative error over the compared outputs (0 when nothing differs)."""
        return max(self.accuracy_errors.values(), default=0.0)

    def amortised_step(self, planned_steps: int) -> float:
        """Step time with the compile cost spread over the planned run."""
        return self.step_median + self.compile_seconds / planned_steps

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class EarlyStop:
    """A measurement stopped before its end: the trial was hopeless against the best so far
    (execution/early_stop.py). `reason`: "steps" (its fastest steps were too slow) or "compile"
    (its compile was cut off); what was measured until then is kept."""

    candidate: dict[str, Any]
    reason: str
    message: str
    steps: list[float]
    first_call_seconds: float
    compile_seconds: float  # spent so far: a lower bound where the compile was cut off
    optimistic_s: float  # the best amortised step the trial could still have reached
    accuracy_errors: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TrialFailure:
    """A trial that produced no usable measurement, and why."""

    kind: FailureKind
    message: str

    def __post_init__(self) -> None:  # a kind read back as its string (a rank's JSON) is the same kind
        object.__setattr__(self, "kind", FailureKind(self.kind))
