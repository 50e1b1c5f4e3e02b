"""The compile agent's reasoning about what a training step compiles (the `compile_scope` knob,
tpu_tuner/knobs/compile_scope.py).

* seeded (``model+loss`` under each compiling execution seed) when the loss's operators take a
  noticeable share of the profiled (eager) step: compiled apart from the model, the loss stays
  eager kernels over the whole output (a log-softmax over the vocabulary and its backward);
* an inference step has no loss: the space leaves the knob out there (`NarrowedByWorkload`).
"""

from __future__ import annotations

from tpu_tuner.knobs.compile_scope import MODEL_AND_LOSS
from tpu_tuner.knobs.execution import compile_options
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.tuning.agents.levers import not_searched

KNOB = "compile_scope"
# Seed the loss compiled with the model from this share of the baseline's (eager, fp32) profiled
# self time, where the model's own kernels are at their slowest: examples/llama.py's loss took
# 4.8% there and compiling it in made the bf16 step 1.13x faster (docs/knobs.md, "compile_scope").
LOSS_SEED_SHARE = 0.03
# Operator names of the common losses and their backward kernels (aten spells them so).
LOSS_OPS = ("log_softmax", "nll_loss", "cross_entropy", "mse_loss", "binary_cross_entropy", "kl_div", "smooth_l1")


def loss_share(profile: Profile) -> float:
    """The share of profiled operator self time in the loss's kernels."""
    return sum(op.share for op in profile.operators if any(part in op.name.lower() for part in LOSS_OPS))


def findings(profile: Profile, left_out: str | None = None) -> list[str]:
    """What the profile says about compiling the loss with the model; `left_out`: why the space
    does not search it for this workload (then said instead)."""
    if not profile.workload.training:
        return []
    share = loss_share(profile)
    if left_out is not None:
        return [
            f"the loss's kernels take {share:.0%} of profiled self time; "
            + not_searched("compiling the loss with the model", left_out)
        ]
    return [
        f"the loss's kernels take {share:.0%} of profiled self time: "
        + (
            "compiling the loss with the model (one graph) is seeded"
            if share >= LOSS_SEED_SHARE
            else "compiling it with the model is searched, not seeded"
        )
    ]


def seeds(
    profile: Profile | None, choices: dict[str, tuple[str, ...]], execution_seeds: list[dict[str, str]]
) -> list[dict[str, str]]:
    """Each compiling execution seed with the loss compiled alongside, for a training profile
    whose loss is a noticeable share (where the space searches the knob)."""
    if profile is None or not profile.workload.training or MODEL_AND_LOSS not in choices.get(KNOB, ()):
        return []
    if loss_share(profile) < LOSS_SEED_SHARE:
        return []
    compiling = [seed for seed in execution_seeds if compile_options(seed.get("execution", "eager")) is not None]
    return [{**seed, KNOB: MODEL_AND_LOSS} for seed in compiling]
