"""The one-line verdict: compute-bound, memory-bound or overhead-bound, with its numbers.

Roofline reasoning: a step cannot be faster than its FLOPs at peak FLOP/s (compute time) nor
than its bytes at memory bandwidth (memory time). Whichever of the two explains most of the
measured step time, if it explains at least `explained_share_min` of it, bounds the step; when
neither does, the time goes elsewhere (op dispatch, kernel launches, Python): overhead-bound.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """The bound, the roofline terms behind it, and a sentence a user can act on."""

    bound: str  # "compute-bound" | "memory-bound" | "overhead-bound"
    compute_seconds: float
    memory_seconds: float | None
    step_seconds: float
    compute_share: float
    memory_share: float | None
    arithmetic_intensity: float | None  # FLOPs per byte moved (unfused estimate)
    ridge_point: float | None  # peak FLOP/s / bandwidth
    ops_per_step: int
    summary: str


def decide(
    flops_per_step: float,
    bytes_per_step: float | None,
    step_seconds: float,
    peak_flops: float,
    peak_dtype: str,
    memory_bytes_per_s: float | None,
    ops_per_step: int,
    explained_share_min: float,
) -> Verdict:
    """Classify a step from its counted FLOPs and bytes against the device's roofline."""
    compute_seconds = flops_per_step / peak_flops
    compute_share = compute_seconds / step_seconds
    memory_seconds = memory_share = intensity = ridge = None
    if bytes_per_step and memory_bytes_per_s:
        memory_seconds = bytes_per_step / memory_bytes_per_s
        memory_share = memory_seconds / step_seconds
        intensity = flops_per_step / bytes_per_step
        ridge = peak_flops / memory_bytes_per_s

    evidence = (
        f"{flops_per_step / 1e9:.3g} GFLOP at the {peak_dtype} peak take {compute_seconds * 1e3:.3g} ms "
        f"({compute_share:.0%} of the {step_seconds * 1e3:.3g} ms step)"
    )
    if memory_seconds is not None:
        evidence += (
            f"; {bytes_per_step / 1e9:.3g} GB of unfused traffic at {memory_bytes_per_s / 1e9:.3g} GB/s "
            f"take {memory_seconds * 1e3:.3g} ms ({memory_share:.0%}); "
            f"intensity {intensity:.3g} FLOP/B vs ridge {ridge:.3g}"
        )

    shares = {"compute-bound": compute_share, "memory-bound": memory_share or 0.0}
    bound, share = max(shares.items(), key=lambda item: item[1])
    if share < explained_share_min:
        bound = "overhead-bound"
        per_op_us = step_seconds / max(ops_per_step, 1) * 1e6
        evidence += f"; {ops_per_step} ops per step, {per_op_us:.3g} us per op on average"
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
        summary=f"{bound}: {evidence}",
    )
