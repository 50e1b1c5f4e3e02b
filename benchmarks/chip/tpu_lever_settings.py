"""The settings benchmarks/chip/tpu_levers.py measures: TorchTPU's levers, each a change over the
reference (`tpu` compile + bf16 autocast), and the changes no knob makes (the optimizer's update
compiled, or deferred and fused by TorchTPU's eager mode). benchmarks/chip/tpu_step_profile.py
profiles any of them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def compile_optimizer(step: Any, backend: Any, workload: Any = None, candidate: Any = None) -> None:
    """The optimizer's update compiled with the device's backend (PyTorch's "compiled optimizer"
    recipe: torch.compile of a function calling `opt.step()`), so the whole step runs as compiled
    programs: forward and backward (the execution knob) and the update. Off the CPU the optimizer
    is made `capturable`, so that its step counts live on the device: on a v5e chip they stayed on
    the CPU and the compiled update failed ("expected tensor to be on tpu, got cpu")."""
    import torch

    optimizer = step.optimizer
    if optimizer is None:
        return
    if backend.kind != "cpu":
        for group in optimizer.param_groups:
            if "capturable" in group:
                group["capturable"] = True
    eager_step = optimizer.step

    @torch.compile(backend=backend.default_compile_backend(), fullgraph=False)
    def compiled_step() -> None:
        eager_step()

    optimizer.step = compiled_step


def defer_optimizer(step: Any, backend: Any, workload: Any = None, candidate: Any = None) -> None:
    """The optimizer's update run under TorchTPU's DeferAndFuse eager mode (`torch.tpu.set_eager_mode`,
    entered around each update only): its hundreds of small foreach ops deferred and fused into few
    programs, the model's compiled programs left as they are. The 335M decoder's step kept the chip
    busy 367.6 of 530.7 ms with the update eager (docs/torchtpu.md, "the seventh"); compiling the
    update instead made the step slower (637 ms)."""
    optimizer = step.optimizer
    if optimizer is None:
        return
    eager_step = optimizer.step

    def deferred_step(*args: Any, **kwargs: Any) -> Any:
        with backend.eager_mode("defer_and_fuse"):
            return eager_step(*args, **kwargs)

    optimizer.step = deferred_step


@dataclass(frozen=True)
class Setting:
    """Knob values over the reference's, and a change made to the built step (a lever no knob has
    yet): `patch(step, backend, workload, candidate)`."""

    knobs: dict[str, str] = field(default_factory=dict)
    patch: Callable[[Any, Any, Any, Any], None] | None = None
    about: str = ""
    baseline: bool = False  # the device's defaults (the user's code unchanged), not the reference's


# The reference is `tpu` compile (the device's torch.compile backend) + bf16 autocast, TorchTPU's
# default matmul precision; every other setting changes one thing, but "stack".
SETTINGS: dict[str, Setting] = {
    "reference": Setting(about="torch.compile(backend='tpu') of the model, bf16 autocast, fp32 AdamW in eager"),
    "baseline": Setting(baseline=True, about="the user's code unchanged: eager (Strict), fp32, matmul medium"),
    "optimizer compiled": Setting(patch=compile_optimizer, about="the optimizer's step compiled too (whole step)"),
    "optimizer deferred": Setting(patch=defer_optimizer, about="the optimizer's step under DeferAndFuse eager mode"),
    "optimizer fused": Setting({"optimizer_impl": "fused"}, about="AdamW(fused=True): torch-tpu's fused AdamW kernel"),
    "bf16 parameters": Setting({"param_dtype": "bfloat16"}, about="parameters and AdamW states in bf16"),
    "loss compiled": Setting({"compile_scope": "model+loss"}, about="the loss compiled with the model"),
    "splash": Setting({"attention_kernel": "splash"}, about="torch.tpu.ops.splash_sdpa, blocks 512"),
    "splash 1024": Setting({"attention_kernel": "splash:1024"}, about="splash_sdpa, every block 1024"),
    "XLA O3": Setting({"xla_optimization_level": "O3"}, about="custom_compiler_options O3"),
    "XLA O1": Setting({"xla_optimization_level": "O1"}, about="custom_compiler_options O1"),
    "matmul high": Setting({"matmul_precision": "high"}, about="3 bf16 passes (a cost, for scale)"),
    "blocks compiled": Setting({"compile_scope": "blocks"}, about="each repeated block compiled on its own"),
    "checkpointed blocks": Setting({"activation_checkpointing": "blocks"}, about="every block recomputed"),
    "every 2nd block": Setting({"activation_checkpointing": "every_2nd"}, about="every 2nd block recomputed"),
    "no checkpointing": Setting({"activation_checkpointing": "none"}, about="no block recomputed"),
    "splash, no checkpointing": Setting(
        {"attention_kernel": "splash", "activation_checkpointing": "none"},
        about="splash (no score matrix kept) lets every block keep its activations",
    ),
    "whole step traced": Setting(
        {"compile_scope": "step"},
        about="forward, backward and AdamW as one traced program: torch.tpu.optimizers.SingleTraceTrainer",
    ),
    "stack": Setting(
        {"param_dtype": "bfloat16", "compile_scope": "model+loss"},
        compile_optimizer,
        "bf16 parameters, loss and optimizer compiled",
    ),
}
