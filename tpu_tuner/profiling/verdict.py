"""The one-line verdict: compute-, memory- or overhead-bound, or kernels below the roofline.

Roofline reasoning: a step cannot be faster than its FLOPs at peak FLOP/s (compute time), nor
than its bytes at memory bandwidth (memory time). The third term is host overhead: where the
profiler traced the device's own events, the share of the step the device sat idle (the step
minus its measured busy time); elsewhere (CPU), the op count times the measured per-op dispatch
cost, and only while that product fits in the step: one that exceeds the step cannot apply as
measured (the per-op figure includes a sync round trip, and on an asynchronous device dispatch
overlaps the device's work), so it is left out, with why. Whichever term explains at least
`explained_share_min` of the measured step time bounds the step. When none does, the kernels
themselves run below the roofline: the verdict says at what share of the peak, and names the
operators that take the time. A step whose times spread too much (high CV: other processes
contending) gets its verdict marked as uncertain.
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
    # Host overhead per step and its share (never above 1): the device's idle time where its
    # busy time was measured, else ops_per_step x the per-op dispatch cost; None when neither
    # was measured or the product exceeds the step (then `dispatch_note` says why).
    dispatch_seconds: float | None = None
    dispatch_share: float | None = None
    dispatch_seconds_per_op: float | None = None
    top_operators: list[tuple[str, float]] = field(default_factory=list)  # (name, share of op time)
    step_cv: float | None = None
    uncertain: bool = False  # the step time spread too much for a verdict to be trusted
    # The device's busy time per step (union of its profiler events) and its share of the step
    # (capped at 1); None where the trace had no device events (CPU) and in older profiles.
    device_busy_seconds: float | None = None
    device_busy_share: float | None = None
    dispatch_note: str | None = None  # why ops x per-op cost was not used, when it was not

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
    device_busy_seconds: float | None = None,
) -> Verdict:
    """Classify a step from its counted FLOPs, bytes and ops against the device's roofline.

    `top_operators` are (name, share of profiled op time) pairs, largest first; `step_cv` is the
    coefficient of variation of the timed steps, above `cv_max` the verdict is marked uncertain.
    `device_busy_seconds` is the device's measured busy time per step (None where not traced):
    when given, the device's idle share is the overhead term instead of ops x per-op cost.
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
    overhead = _overhead(step_seconds, ops_per_step, dispatch_seconds_per_op, device_busy_seconds)

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
    evidence += "; " + overhead.evidence

    shares = {
        "compute-bound": compute_share,
        "memory-bound": memory_share or 0.0,
        "overhead-bound": overhead.share or 0.0,
    }
    bound, share = max(shares.items(), key=lambda item: item[1])
    if share >= explained_share_min:
        summary = f"{bound}: {evidence}"
    else:
        bound = "below-roofline"
        busy = "the device is busy most of the step, yet " if (overhead.busy_share or 0) >= explained_share_min else ""
        summary = (
            f"below-roofline: {busy}no roofline term explains the step; the kernels run at "
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
        dispatch_seconds=overhead.seconds,
        dispatch_share=overhead.share,
        dispatch_seconds_per_op=dispatch_seconds_per_op,
        top_operators=[(name, op_share) for name, op_share in top_operators],
        step_cv=step_cv,
        uncertain=uncertain,
        device_busy_seconds=device_busy_seconds,
        device_busy_share=overhead.busy_share,
        dispatch_note=overhead.note,
    )


@dataclass(frozen=True)
class _Overhead:
    """The overhead term: seconds and share of the step (None: not measured), evidence text."""

    seconds: float | None
    share: float | None
    busy_share: float | None
    evidence: str
    note: str | None = None


def _overhead(step_seconds: float, ops_per_step: int, per_op: float | None, busy_seconds: float | None) -> _Overhead:
    """The host-overhead term: the device's idle share where its busy time was measured, else
    ops x per-op dispatch cost while that fits in the step; never a share above 100%."""
    product = ops_per_step * per_op if per_op is not None else None
    note = None
    if product is not None and product > step_seconds:
        note = (
            f"{ops_per_step} ops x {duration(per_op)} measured dispatch cost would take {duration(product)}, "
            f"{product / step_seconds:.2g}x the whole step: the per-op figure cannot apply as measured (timed on "
            "a tiny op, it includes a device sync round trip, and on an asynchronous device dispatch overlaps "
            "device work), so it is left out"
        )
    if busy_seconds is not None:
        # The trace measured the device itself: its idle share is the overhead, whatever the product.
        busy_share = min(1.0, busy_seconds / step_seconds)
        idle = step_seconds * (1.0 - busy_share)
        evidence = (
            f"device busy {duration(busy_seconds)} per step ({busy_share:.0%}; idle {1 - busy_share:.0%}, "
            f"{duration(idle)}, waiting on the host), from the profiler's device events"
        )
        if busy_seconds > step_seconds:
            evidence += " (more than the timed step: profiled steps run unsynced, so capped at 100%)"
        return _Overhead(idle, 1.0 - busy_share, busy_share, evidence + (f"; {note}" if note else ""), note)
    if note is not None:
        return _Overhead(None, None, None, note, note)
    if product is None or per_op is None:
        return _Overhead(None, None, None, f"{ops_per_step} ops per step (dispatch cost not measured)")
    return _Overhead(
        product,
        product / step_seconds,
        None,
        f"{ops_per_step} ops x {duration(per_op)} measured dispatch cost take {duration(product)} "
        f"({product / step_seconds:.0%})",
    )
