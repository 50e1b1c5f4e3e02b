"""The `compile_scope` knob: what a step compiles: the model as one graph, the model and its loss
as one graph (torchtitan's ``compile.components = ["model", "loss"]``), or each repeated block on
its own (regional compilation, as torchtitan compiles each transformer block).

``model`` (the default) compiles the forward and computes the loss on its output, outside the
compiled graph: the output head's logits are written out whole, and the loss (a log-softmax over
the vocabulary, its backward) runs as eager kernels. ``model+loss`` compiles
``loss_fn(model(inputs), target)`` as one module (`model.workloads.workload.ModelWithLoss`), with the
execution knob's backend and inductor's options, so the compiler fuses the loss with the head.
Measured on examples/gpt.py (vocabulary 8192): docs/knobs.md, "compile_scope".

``blocks`` compiles each of the model's repeated blocks on its own, with the execution's
``torch.compile`` options, and leaves the rest (embedding, head, loss) eager: blocks of one class
give one graph shape, so a backend with a compilation cache (TorchTPU's) compiles one program for
all of them instead of one program as deep as the model (a 16-layer decoder's whole-model compile
took 82-112 s on a v5e). What it costs a step (no fusion across blocks, an eager head):
docs/knobs.md, "compile_scope".

``step`` traces the whole training step, forward, backward and the optimizer's update, into one
program (TorchTPU's ``torch.tpu.optimizers.SingleTraceTrainer``, with its own AdamW), as a JAX
training step is one jitted program: on a v5e chip the README example's step ran 6.1 ms against
14.2 ms under ``model`` (docs/torchtpu.md). `execution/traced_step.py` builds it; the compile
agent refuses it beside what ``torch.func`` cannot trace (recomputed blocks, splash attention).

Searched only where the forward compiles (under eager there is nothing to compile); ``model+loss``
and ``step`` only for training steps (an inference step has no loss), ``blocks`` only for models
with two or more like blocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tpu_tuner.core.errors import WorkloadError
from tpu_tuner.knobs.base import BackendLike, Knob
from tpu_tuner.knobs.capabilities import Conditional, LeavesMemory, NarrowedByWorkload, TrainingStep
from tpu_tuner.model.workloads.blocks import COMPILED_BLOCK_ATTR, compiled_blocks, model_blocks

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch import nn

    from tpu_tuner.knobs.traits import WorkloadTraits

MODEL = "model"
MODEL_AND_LOSS = "model+loss"
BLOCKS = "blocks"
STEP = "step"


# Estimated eagerly, but for a loss inductor fuses (memory_estimate.fuses_loss: in the estimate's key).
class CompileScopeKnob(Knob, Conditional, NarrowedByWorkload, TrainingStep, LeavesMemory):
    """``model``, ``model+loss`` (the loss compiled with the model, as one graph), ``blocks`` (each
    repeated block compiled on its own) or ``step`` (the whole training step traced as one program)."""

    name = "compile_scope"
    agent = "compile"
    default = MODEL
    position = 17  # after execution (10), which it is conditional on, and inductor's options (15)
    values = (MODEL, MODEL_AND_LOSS, BLOCKS, STEP)
    not_applicable = (
        "an inference step has no loss to compile with the model, and the model no two like blocks to compile apart"
    )

    def applies_to_workload(self, traits: WorkloadTraits) -> bool:
        return traits.training or traits.repeated_blocks >= 2

    def choice_refusal(self, value: str, traits: WorkloadTraits) -> str | None:
        if value == MODEL_AND_LOSS and not traits.training:
            return "an inference step has no loss to compile with the model"
        if value == STEP and not traits.training:
            return "an inference step has no backward or optimizer step to trace with its forward"
        if value == BLOCKS and traits.repeated_blocks < 2:
            return "the model has no two like blocks to compile apart"
        return None

    def active(self, settings: Mapping[str, str]) -> bool:
        """Searched only where the forward compiles."""
        from tpu_tuner.knobs.execution import ExecutionKnob, compile_options

        return compile_options(settings.get(ExecutionKnob.name, ExecutionKnob.default)) is not None

    def compiles_loss(self, value: str) -> bool:
        return self.check(value) == MODEL_AND_LOSS

    def traces_step(self, value: str) -> bool:
        return self.check(value) == STEP

    def forward(
        self, value: str, fn: Callable[..., Any], backend: BackendLike, static_shapes: bool = False
    ) -> Callable[..., Any]:
        """For ``blocks``: the model the execution knob compiled whole, uncompiled, with each of its
        blocks compiled on its own with the same options (the execution and compiler-option knobs
        come first, `position`)."""
        from tpu_tuner.knobs.execution import COMPILE_KWARGS_ATTR, EXECUTION_ATTR

        execution = getattr(fn, EXECUTION_ATTR, None)
        if value != BLOCKS or execution is None:
            return fn  # eager: nothing compiles, so there is nothing to compile apart
        model = getattr(fn, "_orig_mod", None)  # torch.compile's module wrapper holds the module
        if model is None:
            raise WorkloadError("compile_scope = blocks compiles a model's blocks; the step's forward is no module")
        compile_blocks(model, **getattr(fn, COMPILE_KWARGS_ATTR))
        setattr(model, EXECUTION_ATTR, execution)  # what the execution knob's `observe` reports
        return model

    def observe(self, model: nn.Module, forward: Callable[..., Any], backend: BackendLike) -> str | None:
        return BLOCKS if compiled_blocks(forward) else None  # the other two are read from the loss

    def describe(self, value: str) -> str:
        described = {
            MODEL_AND_LOSS: "loss compiled with the model",
            BLOCKS: "each block compiled apart",
            STEP: "the whole step traced as one program",
        }
        return described.get(value, "")

    def code(self, value: str, device_kind: str) -> list[str]:
        if value != BLOCKS:
            return []
        return [
            "from tpu_tuner.knobs.compile_scope import compile_blocks",
            "model = compile_blocks(model)  # each repeated block compiled on its own, with the options above",
        ]

    def training_code(self, value: str, device_kind: str) -> list[str]:
        if value == STEP:
            return list(TRACED_STEP_CODE)
        if value != MODEL_AND_LOSS:
            return []
        return [
            "# the loss compiled with the model as one graph, as the trial built it: "
            "call training_loss(inputs, target) where your loop calls loss_fn(model(inputs), target)",
            "training_loss = applied.training_loss(loss_fn)",
        ]

    def observe_training(self, optimizer: Any, micro_batches: int, loss: Any) -> str | None:
        import torch

        from tpu_tuner.model.workloads.workload import ModelWithLoss

        compiled = isinstance(loss, torch._dynamo.eval_frame.OptimizedModule)
        return MODEL_AND_LOSS if compiled and isinstance(loss._orig_mod, ModelWithLoss) else MODEL


# The user's loop with the whole step traced, as execution/traced_step.py builds it (torch-tpu's
# public `torch.tpu.optimizers`; bf16 moments only beside bf16 parameters).
TRACED_STEP_CODE = (
    "# the whole step traced as one program (torch-tpu's SingleTraceTrainer, experimental in 0.2.0), with its",
    "# AdamW at your AdamW's settings: it replaces loss.backward(), optimizer.step() and optimizer.zero_grad()",
    "group = optimizer.param_groups[0]",
    "adamw = torch.tpu.optimizers.AdamW(lr=group['lr'], weight_decay=group['weight_decay'], beta1=group['betas'][0],",
    "    beta2=group['betas'][1], eps=group['eps'],",
    "    use_bfloat16_moments=all(p.dtype == torch.bfloat16 for p in model.parameters()))",
    "trainer = torch.tpu.optimizers.SingleTraceTrainer(model, adamw,",
    "    compile_fn=lambda graph: torch.compile(graph, backend='tpu'),",
    "    compute_loss_fn=lambda m, args, kwargs: loss_fn(m(args[0]), args[1]))",
    "train_step = trainer.make_compiled_train_step((inputs, target))  # traced and compiled once",
    "loss = train_step((inputs, target))  # every step: forward, backward and the update",
)


def compile_blocks(model: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """Each repeated block of `model` compiled on its own (``nn.Module.compile``, in place), the rest
    left eager; returns the module. `model` as ``torch.compile`` returned it takes its backend
    (and no other option); a plain module takes `compile_kwargs`. Raises WorkloadError where the
    model has no two like blocks."""
    if not compile_kwargs and hasattr(model, "_orig_mod"):
        from tpu_tuner.knobs.execution import compiled_backend_name

        backend = compiled_backend_name(model)
        if backend is None:  # this torch lays out dynamo's wrappers otherwise
            raise WorkloadError("compile_blocks cannot read the compiled model's backend: pass backend=...")
        compile_kwargs = {"backend": backend}
    model = getattr(model, "_orig_mod", model)
    blocks = model_blocks(model)
    if len(blocks) < 2:
        raise WorkloadError(f"compile_scope = blocks needs two or more like blocks and {type(model).__name__} has none")
    for block in blocks:
        # One compile wrapper a block: a wrapper shared by all would guard on each block's identity
        # and recompile per block, past dynamo's recompile limit on a deep model.
        block.compile(**compile_kwargs)
        setattr(block, COMPILED_BLOCK_ATTR, dict(compile_kwargs))
    return model
