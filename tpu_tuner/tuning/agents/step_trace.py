"""The compile agent's reasoning about the whole training step traced as one program
(`compile_scope = step`: execution/traced_step.py, TorchTPU's SingleTraceTrainer).

* seeded under each compiling execution seed, on top of the agents' combined seed (which carries
  the precision agent's bf16 parameters where it seeds them: seeding.py). On a v5e chip the
  README example's step traced whole with bf16 parameters ran 6.1 ms against 14.2 ms with the
  model compiled (2.31x, 2.06-2.58; docs/torchtpu.md, "the seventh"), the largest lever measured;
* refused unmeasured beside what ``torch.func`` cannot trace in torch-tpu 0.2.0 (recomputed
  blocks: saved-tensor hooks; splash attention: an autograd function without ``setup_context``),
  beside micro-batches (the trainer takes one batch) and a sharding layout (one device's step),
  and with an optimizer implementation (the trainer's own AdamW replaces the user's update).
"""

from __future__ import annotations

from tpu_tuner.knobs.attention_kernel import SPLASH
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.compile_scope import STEP
from tpu_tuner.knobs.execution import compile_options
from tpu_tuner.knobs.layout import layout_in
from tpu_tuner.tuning.agents.levers import not_searched

KNOB = "compile_scope"
WHAT = "the whole step traced as one program"


def findings(training: bool, searched: bool, left_out: str | None = None) -> list[str]:
    """What the agent says of the traced step, for a training step (`searched`: the space holds it)."""
    if not training:
        return []
    if not searched:
        return [not_searched(WHAT, left_out or "the space does not offer compile_scope = step")]
    return [f"{WHAT} (forward, backward and AdamW: TorchTPU's SingleTraceTrainer) is seeded, compiled"]


def seeds(choices: dict[str, tuple[str, ...]], execution_seeds: list[dict[str, str]]) -> list[dict[str, str]]:
    """Each compiling execution seed with the step traced whole, where the space searches it."""
    if STEP not in choices.get(KNOB, ()):
        return []
    compiling = [seed for seed in execution_seeds if compile_options(seed.get("execution", "eager")) is not None]
    return [{**seed, KNOB: STEP} for seed in compiling]


def validate(candidate: Candidate) -> str | None:
    """Why a setting with the step traced whole cannot run (None: it can)."""
    if candidate[KNOB] != STEP or compile_options(candidate["execution"]) is None:
        return None
    head = f"{KNOB} = {STEP} skipped"
    if candidate["activation_checkpointing"] != "none":
        return (
            f"{head} beside activation_checkpointing {candidate['activation_checkpointing']}: torch.func, which "
            "traces the step, takes no saved-tensor hooks, and recomputed blocks are made of them"
        )
    if candidate["attention_kernel"].partition(":")[0] == SPLASH:
        return (
            f"{head} beside splash attention: torch-tpu 0.2.0's splash kernel is an autograd function "
            "without setup_context, which torch.func refuses"
        )
    if candidate["micro_batches"] != "1":
        return f"{head} beside micro_batches {candidate['micro_batches']}: the traced step takes one batch"
    if layout_in(candidate).devices > 1:
        return f"{head} under layout {candidate['layout']}: the traced step is one device's"
    if candidate["optimizer_impl"] != "default":
        return f"{head} with optimizer_impl {candidate['optimizer_impl']}: the traced step runs its own AdamW"
    return None
