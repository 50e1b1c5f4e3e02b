"""The `optimizer_impl` knob: the implementation of the training step's optimizer.

PyTorch's Adam, AdamW and SGD each have three implementations: a Python loop over parameters
(``foreach=False``), one multi-tensor kernel per operation over all parameters (``foreach=True``,
the default on CUDA) and one fused kernel for the whole update (``fused=True``; on CPU since
torch 2.4). The update's numerics are the same up to rounding; what changes is how many kernels
the optimizer step launches. "default" is the optimizer exactly as the model file built it.

The knob rebuilds the file's optimizer (``make_optimizer``; tpu-tune's AdamW stand-in where the
file declares none) with the flag, keeping its parameter groups and hyper-parameters. An optimizer
of another type has no such flag: the trial fails with a one-line reason. On TorchTPU "fused"
runs torch-tpu 0.2.0's own fused AdamW kernel (docs/knobs.md, "Knobs of the training step").
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from tpu_tuner.core.errors import WorkloadError
from tpu_tuner.knobs.base import BackendLike, Knob
from tpu_tuner.knobs.capabilities import NarrowedByWorkload, TrainingStep

if TYPE_CHECKING:
    from tpu_tuner.knobs.traits import WorkloadTraits

DEFAULT = "default"
FORLOOP = "forloop"
FOREACH = "foreach"
FUSED = "fused"
# The optimizers whose constructors take `foreach` and `fused` (torch.optim names).
FLAGGED = ("Adam", "AdamW", "SGD")


class OptimizerImplKnob(Knob, NarrowedByWorkload, TrainingStep):
    name = "optimizer_impl"
    agent = "compile"
    default = DEFAULT
    position = 60
    values = (DEFAULT, FORLOOP, FOREACH, FUSED)
    device_kinds = ("cpu", "cuda", "tpu")
    not_applicable = "an inference step has no optimizer"
    described = "{value} optimizer"

    def applies_to_workload(self, traits: WorkloadTraits) -> bool:
        return traits.training  # an inference step has no optimizer

    def optimizer(self, value: str, optimizer: Any, backend: BackendLike) -> Any:
        if value == DEFAULT or optimizer is None:
            return optimizer
        return rebuild(optimizer, value)

    def training_code(self, value: str, device_kind: str) -> list[str]:
        if value == DEFAULT:
            return []
        flags = {FORLOOP: "foreach=False", FOREACH: "foreach=True", FUSED: "fused=True"}[value]
        return [
            f"# the optimizer, built with {flags} (Adam, AdamW and SGD take it; AdamW was measured where "
            "the model file declares no optimizer):",
            f"optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, {flags})",
        ]

    def observe_training(self, optimizer: Any, micro_batches: int, loss: Any) -> str | None:
        return implementation(optimizer)


def implementation(optimizer: Any) -> str | None:
    """The implementation flag an optimizer was built with (None where it has none)."""
    if optimizer is None or type(optimizer).__name__ not in FLAGGED:
        return None
    defaults = optimizer.defaults
    if defaults.get("fused"):
        return FUSED
    if defaults.get("foreach") is True:
        return FOREACH
    if defaults.get("foreach") is False:
        return FORLOOP
    return DEFAULT


def rebuild(optimizer: Any, value: str) -> Any:
    """A fresh optimizer of the same type over the same parameter groups, with the implementation
    `value` (before any step, so there is no state to carry over)."""
    kind = type(optimizer)
    if kind.__name__ not in FLAGGED or kind.__module__.split(".")[:2] != ["torch", "optim"]:
        raise WorkloadError(
            f"optimizer_impl {value}: the model file's optimizer is {kind.__name__}; only "
            f"torch.optim {', '.join(FLAGGED)} take foreach/fused"
        )
    flags = {"foreach": value == FOREACH if value != FUSED else None, "fused": value == FUSED or None}
    groups = [
        {**{k: v for k, v in group.items() if k not in ("foreach", "fused")}, **flags}
        for group in optimizer.param_groups
    ]
    # The defaults the constructor takes (AdamW keeps an internal `decoupled_weight_decay` it refuses).
    accepted = inspect.signature(kind.__init__).parameters
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted and k not in ("foreach", "fused")}
    try:
        return kind(groups, **{**defaults, **flags})
    except (RuntimeError, ValueError, TypeError) as exc:  # e.g. fused on a device without it
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise WorkloadError(f"optimizer_impl {value}: {kind.__name__} refused it: {message}") from exc
