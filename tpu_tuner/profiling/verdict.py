"""The one-line verdict: compute-, memory- or overhead-bound, or kernels below the roofline.

Roofline reasoning: a step cannot be faster than its FLOPs at peak FLOP/s (compute time), than
its bytes at memory bandwidth (memory time), nor than its op count times the measured per-op
dispatch cost (dispatch time). Whichever of the three explains at least `explained_share_min`
of the measured step time bounds the step. When none does, the kernels themselves run below the
roofline: the verdict says at what share of the peak, and names the operators that take the time.
A step whose times spread too much (high CV: other processes contending) gets its verdict
marked as uncertain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tpu_tuner.core.units import duration, si
from tpu_tuner.metrics.mfu import share_of_peak

MATMUL_LIKE = ("mm", "matmul", "linear", "conv", "attention", "bmm", "baddbmm", "addmm", "rnn", "lstm", "gru")


def is_matmul_like(operator: str) -> bool:
    """Whether an operator name is a matmul / convolution / attention kernel (compute-heavy)."""
    name = operator.lower()
    return any(key in name for key in MATMUL_LIKE)


@dataclass(frozen=True)
class Verdict:
    """The bound, the roofline terms behind it, and a sentence a user can act on."""

    bound: str  # "compute-bound", "memory-bound", "overhead-bound" or "below-roofline"
    compute_seconds: float
    memory_seconds: float | None
    step_seconds: float
    compute_share: float  # also the achieved share of the peak FLOP/s (counted FLOPs)
    memory_share: float | None
    arithmetic_intensity: float | None  # FLOPs per byte moved (unfused estimate)
    ridge_point: float | None  # peak FLOP/s / bandwidth
    ops_per_step: int
    summary: str
    dispatch_seconds: float | None = None  # ops_per_step x measured per-op dispatch cost
    dispatch_share: float | None = None
    dispatch_seconds_per_op: float | None = None
    top_operators: list[tuple[str, float]] = field(default_factory=list)  # (name, share of op time)
    step_cv: float | None = None
    uncertain: bool = False  # the step time spread too much for a verdict to be trusted

    @property
    def compute_kernels_dominate(self) -> bool:
        """Whether matmul-like operators take most of the top operators' time."""
        total = sum(share for _, share in self.top_operators)
        heavy = sum(share for name, share in self.top_operators if is_matmul_like(name))
        return total > 0 and heavy >= total / 2


def decide(
    flops_per_step: float,
    bytes_per_step: float | None,
    step_seconds: float,
    peak_flops: float,
    peak_dtype: str,
    memory_bytes_per_s: float | None,
    ops_per_step: int,
    explained_share_min: float,
    dispatch_seconds_per_op: float | None = None,
    top_operators: Sequence[tuple[str, float]] = (),
    step_cv: float | None = None,
    cv_max: float = 0.25,
) -> Verdict:
    """Classify a step from its counted FLOPs, bytes and ops against the device's roofline.

    `top_operators` are (name, share of profiled op time) pairs, largest first; `step_cv` is the
    coefficient of variation of the timed steps, above `cv_max` the verdict is marked uncertain.
    """
    compute_seconds = flops_per_step / peak_flops
    compute_share = share_of_peak(compute_seconds, step_seconds)
    if 1.0 < compute_share <= 1.0 + 1e-9:
        # A peak raised to the achieved rate (metrics.mfu.checked_peak) gives exactly 1 in exact
        # arithmetic; the recomputed ratio may land a few ulps above it.
        compute_share = 1.0
    memory_seconds = memory_share = intensity = ridge = None
    if bytes_per_step and memory_bytes_per_s:
        memory_seconds = bytes_per_step / memory_bytes_per_s
        memory_share = memory_seconds / step_seconds
        intensity = flops_per_step / bytes_per_step
        ridge = peak_flops / memory_bytes_per_s
    dispatch_seconds = dispatch_share = None
    if dispatch_seconds_per_op is not None:
        dispatch_seconds = ops_per_step * dispatch_seconds_per_op
        dispatch_share = dispatch_seconds / step_seconds

    # Readable units (core/units.py): "8.19 kFLOP ... take 19.0 ns", never "8.19e-06 GFLOP".
    evidence = (
        f"{si(flops_per_step, 'FLOP')} at the {peak_dtype} peak take {duration(compute_seconds)} "
        f"({compute_share:.0%} of the {duration(step_seconds)} step)"
    )
    if memory_seconds is not None:
        evidence += (
            f"; {si(bytes_per_step, 'B')} of unfused traffic at {si(memory_bytes_per_s, 'B/s')} "
            f"take {duration(memory_seconds)} ({memory_share:.0%}); "
            f"intensity {intensity:.3g} FLOP/B vs ridge {ridge:.3g}"
        )
    if dispatch_seconds is not None:
        evidence += (
            f"; {ops_per_step} ops x {duration(dispatch_seconds_per_op)} measured dispatch cost take "
            f"{duration(dispatch_seconds)} ({dispatch_share:.0%})"
        )
    else:
        evidence += f"; {ops_per_step} ops per step (dispatch cost not measured)"

    shares = {
        "compute-bound": compute_share,
        "memory-bound": memory_share or 0.0,
        "overhead-bound": dispatch_share or 0.0,
    }
    bound, share = max(shares.items(), key=lambda item: item[1])
    if share >= explained_share_min:
        summary = f"{bound}: {evidence}"
    else:
        bound = "below-roofline"
        summary = (
            f"below-roofline: no roofline term explains the step; the kernels run at "
            f"{compute_share:.1%} of the {peak_dtype} peak. {evidence}"
        )
        if top_operators:
            summary += "; time goes to " + ", ".join(f"{name} ({op_share:.0%})" for name, op_share in top_operators)
    uncertain = step_cv is not None and step_cv > cv_max
    if uncertain:
        summary = (
            f"uncertain (step-time robust CV {step_cv:.0%} > {cv_max:.0%}: other processes may be "
            f"contending for the device; re-profile on a quiet machine): {summary}"
        )
    return Verdict(
        bound=bound,
        compute_seconds=compute_seconds,
        memory_seconds=memory_seconds,
        step_seconds=step_seconds,
        compute_share=compute_share,
        memory_share=memory_share,
        arithmetic_intensity=intensity,
        ridge_point=ridge,
        ops_per_step=ops_per_step,
        summary=summary,
        dispatch_seconds=dispatch_seconds,
        dispatch_share=dispatch_share,
        dispatch_seconds_per_op=dispatch_seconds_per_op,
        top_operators=[(name, op_share) for name, op_share in top_operators],
        step_cv=step_cv,
        uncertain=uncertain,
    )
