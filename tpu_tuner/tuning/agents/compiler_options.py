"""The compile agent's reasoning about inductor's options (the `compile_options` knob).

* Findings and seeds: for an *inference* step whose time is in matmul / convolution kernels
  (compute-heavy), inductor's ``freezing`` (weights become constants: folded, prepacked for
  oneDNN / cuBLAS) and ``max-autotune`` (benchmarked GEMM / convolution templates) are what a
  compiler can add beyond fusion, so both are seeded under inductor. An elementwise-dominated
  step gains from fusion alone: the options are searched, not seeded.
* Rejections without measuring: ``freezing`` for a training step (inductor freezes only graphs
  compiled without grad, and the optimizer changes the weights it would bake in); CUDA graphs
  off CUDA (the space refuses them at load time too).
"""

from __future__ import annotations

from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.compile_options import CUDAGRAPHS, FREEZING, FULLGRAPH, MAX_AUTOTUNE, flags
from tpu_tuner.knobs.layout import layout_in
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.tuning.agents.levers import not_searched

KNOB = "compile_options"
SEEDED = (FREEZING, f"{FREEZING}+{MAX_AUTOTUNE}")  # in this order


def compute_heavy(profile: Profile) -> bool:
    """Whether matmul / convolution kernels dominate the profiled step."""
    verdict = getattr(profile, "verdict", None)
    if verdict is None:
        return False
    return verdict.bound == "compute-bound" or bool(verdict.compute_kernels_dominate)


def findings(profile: Profile, left_out: str | None = None) -> list[str]:
    """What the profile says about inductor's options; `left_out`: why the space does not search
    them for this workload (then said instead of seeding them)."""
    if profile.workload.training:
        return [
            "training step: inductor freezing is skipped (it bakes the weights the optimizer updates "
            "into the compiled graph, and inductor freezes only graphs compiled without grad)"
        ]
    if left_out is not None:
        return [not_searched("inductor freezing / max-autotune", left_out)]
    if compute_heavy(profile):
        return [
            "inference dominated by matmul/convolution kernels: inductor freezing (constant weights, "
            "prepacked kernels) and max-autotune (benchmarked GEMM/convolution templates) are seeded"
        ]
    return [
        "inference dominated by elementwise/data-movement kernels: inductor's fusion is what helps; "
        "freezing / max-autotune are searched, not seeded"
    ]


def seeds(profile: Profile | None, choices: dict[str, tuple[str, ...]]) -> list[dict[str, str]]:
    """Inductor with freezing, then freezing + max-autotune, for a compute-heavy inference
    profile (where the space has them: `choices` is the agent's searched name -> choices)."""
    options, execution = choices.get(KNOB, ()), choices.get("execution", ())
    if profile is None or "inductor" not in execution or profile.workload.training or not compute_heavy(profile):
        return []
    return [{"execution": "inductor", KNOB: value} for value in SEEDED if value in options]


def validate(candidate: Candidate, training: bool | None, device_kind: str) -> str | None:
    """Why the candidate's compiler options cannot apply; None where they can."""
    on = flags(candidate[KNOB])
    if FREEZING in on and training:
        return (
            "freezing skipped: the step trains, and inductor freezing bakes the weights the optimizer "
            "updates into the graph (it applies only to graphs compiled without grad)"
        )
    if CUDAGRAPHS in on and device_kind != "cuda":
        return f"cudagraphs skipped: CUDA graphs exist only on CUDA, not {device_kind}"
    layout = layout_in(candidate)
    data, fsdp, tensor = layout.data, layout.fsdp, layout.tensor
    if FREEZING in on and tensor > 1:
        # Freezing folds the graph's parameter inputs into constants, and under tensor parallelism
        # one input is the process group of the collectives (a script object, no tensor): the compile
        # fails on every rank ("cannot assign FakeScriptObject to buffer", examples/mlp.py and
        # tests/fixtures/tiny_residual_mlp.py on 2 ranks; FSDP and replicas compile).
        return (
            "freezing skipped: under tensor parallelism (layout " + layout.short() + ") inductor freezing "
            "cannot fold the collectives' process group into a constant (the compile fails)"
        )
    if FULLGRAPH in on and data > 1 and fsdp == tensor == 1 and training is not False:
        # (An inference step's data axis is plain replicas, which compile whole.)
        # Such a trial fails at its first step, so it is rejected unmeasured (the failures that
        # showed it: docs/sharding.md, `benchmarks/parallel/sharded_study.py`).
        return (
            "fullgraph skipped: under DDP (layout " + layout.short() + ") dynamo cannot compile the "
            "forward as one graph (it splits it at DDP's gradient buckets)"
        )
    return None
