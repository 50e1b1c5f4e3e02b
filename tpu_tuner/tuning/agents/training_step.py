"""The compile agent's reasoning about the training step's optimizer implementation
(tpu_tuner/knobs/optimizer_impl.py). Micro-batching, the other training-step knob, is a memory
knob: the memory agent reasons about it against the study's memory limit.

* seeded ("fused") when the optimizer's operators take a noticeable share of the profiled self
  time: a fused update only saves the kernel launches of that part of the step;
* an inference step has no optimizer: a setting is rejected without measuring.
"""

from __future__ import annotations

from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.layout import layout_in
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.tuning.agents.levers import not_searched

KNOB = "optimizer_impl"
# Seed the fused optimizer when the update takes at least this share of profiled self time. Low on
# purpose: fused does the same update in one pass over parameters and state, with no known
# downside where the device has it (PyTorch's optimizer docs rank it fastest), and the baseline
# profile understates the update's share of a tuned step (autocast shrinks the matmuls, not the
# fp32 update); the seed costs one trial. Measured share and gain: docs/knobs.md.
OPTIMIZER_SEED_SHARE = 0.01
# Operator names of an optimizer update: multi-tensor and fused kernels, and the in-place ops
# Adam's per-parameter loop is made of.
OPTIMIZER_OPS = ("_foreach_", "_fused_", "adam", "addcdiv", "addcmul", "lerp_")


def optimizer_share(profile: Profile) -> float:
    """The share of profiled self time in the optimizer update: from its profiler range where
    the profile measured it, else (older profiles) the update operators among the top ones."""
    measured = getattr(profile, "optimizer_share", None)
    if measured is not None:
        return float(measured)
    return sum(op.share for op in profile.operators if any(part in op.name.lower() for part in OPTIMIZER_OPS))


def findings(profile: Profile, left_out: str | None = None) -> list[str]:
    """What the profile says about the optimizer implementation; `left_out`: why the space does
    not search it for this workload (then said instead)."""
    if not profile.workload.training:
        return ["inference step: the optimizer implementation does not apply (no optimizer step)"]
    share = optimizer_share(profile)
    if left_out is not None:
        return [
            f"the optimizer update takes {share:.0%} of profiled self time; "
            + not_searched("a fused optimizer", left_out)
        ]
    return [
        f"the optimizer update takes {share:.0%} of profiled self time: "
        + (
            "a fused optimizer is seeded"
            if share >= OPTIMIZER_SEED_SHARE
            else "its implementation is searched, not seeded"
        )
    ]


def seeds(profile: Profile | None, choices: dict[str, tuple[str, ...]]) -> list[dict[str, str]]:
    """The fused optimizer alone, where it is searched and the update's share is noticeable."""
    if profile is None or not profile.workload.training or "fused" not in choices.get(KNOB, ()):
        return []
    return [{KNOB: "fused"}] if optimizer_share(profile) >= OPTIMIZER_SEED_SHARE else []


def validate(candidate: Candidate, profile_is_training: bool | None) -> str | None:
    """Reject an optimizer implementation on an inference step (it would measure the baseline again)."""
    if profile_is_training is False and KNOB in candidate.changed:
        return f"{KNOB} skipped: an inference step has no optimizer step"
    layout = layout_in(candidate)
    fsdp, tensor = layout.fsdp, layout.tensor
    if candidate[KNOB] in ("foreach", "fused") and tensor > 1 and fsdp == 1:
        # Such a trial fails at its optimizer step ("got mixed torch.Tensor and DTensor"), so it
        # is rejected unmeasured (docs/sharding.md).
        return (
            f"{KNOB} {candidate[KNOB]} skipped: tensor parallelism alone (layout {layout.short()}) leaves the "
            "embeddings and norms plain tensors beside the sharded DTensors, and the multi-tensor kernels take "
            "one kind (with fsdp every parameter is a DTensor)"
        )
    return None
