"""The compile agent's reasoning about the training step's optimizer implementation
(tpu_tuner/knobs/optimizer_impl.py). Micro-batching, the other training-step knob, is a memory
knob: the memory agent reasons about it against the study's memory limit.

* seeded ("fused") when the optimizer's operators take a noticeable share of the profiled self
  time: a fused update only saves the kernel launches of that part of the step;
* an inference step has no optimizer: a setting is rejected without measuring.
"""

from __future__ import annotations

from tpu_tuner.candidate import Candidate
from tpu_tuner.profiling.profile import Profile

KNOB = "optimizer_impl"
# Seed the fused optimizer when its operators take at least this share of profiled self time.
OPTIMIZER_SEED_SHARE = 0.10
# Operator names of an optimizer update: multi-tensor and fused kernels, and the in-place ops
# Adam's per-parameter loop is made of.
OPTIMIZER_OPS = ("_foreach_", "_fused_", "adam", "addcdiv", "addcmul", "lerp_")


def is_training(profile: Profile) -> bool:
    """Whether the profiled step is a training step (a profile that does not say is taken as not)."""
    return str((getattr(profile, "workload", None) or {}).get("step", "")).startswith("training")


def optimizer_share(profile: Profile) -> float:
    """The share of profiled self time in optimizer-update operators."""
    return sum(op.share for op in profile.operators if any(part in op.name.lower() for part in OPTIMIZER_OPS))


def findings(profile: Profile) -> list[str]:
    """What the profile says about the optimizer implementation."""
    if not is_training(profile):
        return ["inference step: the optimizer implementation does not apply (no optimizer step)"]
    share = optimizer_share(profile)
    return [f"optimizer-update operators take {share:.0%} of profiled self time: "
            + ("a fused optimizer is seeded" if share >= OPTIMIZER_SEED_SHARE
               else "its implementation is searched, not seeded")]


def seeds(profile: Profile | None, choices: dict[str, tuple[str, ...]]) -> list[dict[str, str]]:
    """The fused optimizer alone, where it is searched and the update's share is noticeable."""
    if profile is None or not is_training(profile) or "fused" not in choices.get(KNOB, ()):
        return []
    return [{KNOB: "fused"}] if optimizer_share(profile) >= OPTIMIZER_SEED_SHARE else []


def validate(candidate: Candidate, profile_is_training: bool | None) -> str | None:
    """Reject an optimizer implementation on an inference step (it would measure the baseline again)."""
    if profile_is_training is False and KNOB in candidate.changed:
        return f"{KNOB} skipped: an inference step has no optimizer step"
    return None
