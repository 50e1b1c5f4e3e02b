"""A `Measurement`: what one trial measured, or why it failed.

Accuracy is judged against the baseline (docs/tuning.md, "Accuracy against the baseline"): a
trial's relative error against the fp32 reference may exceed the baseline's own by at most the
tolerance, part by part. On a TPU the baseline (TorchTPU's default, one bf16 pass) is itself
~2e-2 off fp32, so the fp32 error alone would refuse the user's own code.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from tpu_tuner.core.failures import FailureKind


def _baseline_part(baseline_errors: Mapping[str, float], name: str) -> float:
    """The baseline's error of one part; 0 (the fp32 rule) where it has none, or no finite one:
    a baseline that produced no finite output sets no level to be judged against."""
    value = baseline_errors.get(name, 0.0)
    return value if math.isfinite(value) else 0.0


def accuracy_excess(errors: Mapping[str, float], baseline_errors: Mapping[str, float]) -> float:
    """How much less accurate than the baseline a setting is: the largest, over the compared
    parts, of its error against fp32 minus the baseline's (negative: more accurate; 0 with no
    parts). Without baseline figures (older measurements) it is the error against fp32."""
    return max((error - _baseline_part(baseline_errors, name) for name, error in errors.items()), default=0.0)


def accuracy_refusal(errors: Mapping[str, float], baseline_errors: Mapping[str, float], tolerance: float) -> str:
    """Why a setting whose excess is over `tolerance` is refused, with the figures of its worst part:
    "accuracy error 3.10e-02 vs fp32, baseline 1.90e-02: 1.20e-02 more than the baseline > tolerance 0.01";
    without the baseline's figures, judged against fp32 alone: "accuracy error 0.5 > tolerance 0.01"."""
    if not baseline_errors:
        return f"accuracy error {max(errors.values()):.3g} > tolerance {tolerance:g}"
    name = max(errors, key=lambda part: errors[part] - _baseline_part(baseline_errors, part))
    error, baseline = errors[name], _baseline_part(baseline_errors, name)
    part = f" ({name})" if len(errors) > 1 else ""
    return (
        f"accuracy error{part} {error:.2e} vs fp32, baseline {baseline:.2e}: {error - baseline:.2e} more than the "
        f"baseline > tolerance {tolerance:g}"
    )


class AccuracyFigures:
    """The accuracy figures of a trial (`Measurement`, `EarlyStop`), each the largest over the
    compared parts (the loss and the gradients, or the output)."""

    accuracy_errors: dict[str, float]  # against the fp32 reference
    baseline_errors: dict[str, float]  # the baseline's against the fp32 reference, same worker
    errors_vs_baseline: dict[str, float]  # against the baseline's outputs

    @property
    def accuracy_error(self) -> float:
        """The largest relative error against fp32 over the compared outputs (0 when nothing differs)."""
        return max(self.accuracy_errors.values(), default=0.0)

    @property
    def baseline_error(self) -> float | None:
        """The baseline's largest relative error against fp32; None where it was not computed."""
        return max(self.baseline_errors.values(), default=None)

    @property
    def error_vs_baseline(self) -> float | None:
        """The largest relative error against the baseline's outputs; None where there were none."""
        return max(self.errors_vs_baseline.values(), default=None)

    @property
    def accuracy_excess(self) -> float:
        """What the guardrail judges: the error against fp32 beyond the baseline's (`accuracy_excess`)."""
        return accuracy_excess(self.accuracy_errors, self.baseline_errors)

    def accuracy_refused(self, tolerance: float) -> bool:
        """Whether the guardrail refuses the setting: more than `tolerance` less accurate than the baseline."""
        return self.accuracy_excess > tolerance


@dataclass
class Measurement(AccuracyFigures):
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
    # The baseline's relative errors against the fp32 reference (computed once in the trial's
    # worker) and this setting's against the baseline's outputs, by part; empty in older
    # measurements, or where the baseline could not run (the setting is then judged against fp32).
    baseline_errors: dict[str, float] = field(default_factory=dict)
    errors_vs_baseline: dict[str, float] = field(default_factory=dict)
    # Seconds this job spent computing the fp32 reference's and the baseline's outputs (0 where the
    # worker had them from an earlier job): a trial's cost that a process comparing settings skips.
    reference_seconds: float = 0.0
    # Seconds of this job's other phases beyond its compile and steps: the memory estimate before
    # the step, building it (model, optimizer, batch), and judging its outputs (0 in older ones).
    estimate_seconds: float = 0.0
    build_seconds: float = 0.0
    judge_seconds: float = 0.0
    # Steps run back to back for each sample, the block ended by a host read of the last step's
    # result (execution/timer.py); 1 in older measurements (each step synced alone).
    steps_per_sample: int = 1

    @property
    def estimate_error(self) -> float | None:
        """The estimate's error relative to the measured peak (+0.05: 5% high), where both exist."""
        if self.estimated_peak_bytes is None or not self.peak_memory_bytes:
            return None
        return self.estimated_peak_bytes / self.peak_memory_bytes - 1

    def amortised_step(self, planned_steps: int) -> float:
        """Step time with the compile cost spread over the planned run."""
        return self.step_median + self.compile_seconds / planned_steps

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class EarlyStop(AccuracyFigures):
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
    baseline_errors: dict[str, float] = field(default_factory=dict)
    errors_vs_baseline: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TrialFailure:
    """A trial that produced no usable measurement, and why."""

    kind: FailureKind
    message: str

    def __post_init__(self) -> None:  # a kind read back as its string (a rank's JSON) is the same kind
        object.__setattr__(self, "kind", FailureKind(self.kind))
