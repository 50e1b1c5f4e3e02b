"""A training step traced whole (`compile_scope = step`): forward, backward and the optimizer's
update as one program, as a JAX training step is one jitted program.

TorchTPU 0.2.0 ships it as ``torch.tpu.optimizers.SingleTraceTrainer`` (experimental): ``make_fx``
of ``torch.func.grad_and_value`` of the loss and of a functional optimizer's update, compiled by a
callback (here ``torch.compile`` with the device's backend, the public way to reach it). Its AdamW
replaces the user's at the same hyperparameters; its moments are bf16 only beside bf16
parameters (with fp32 ones its update mixed the dtypes and failed on a v5e chip). On that chip the
README example's step ran 6.1 ms traced whole against 14.2 ms with the model compiled (2.31x,
docs/torchtpu.md, "the seventh"). What ``torch.func`` cannot trace there: non-reentrant
checkpointing (saved-tensor hooks) and an ``autograd.Function`` without ``setup_context``
(torch-tpu's own splash attention), so the compile agent refuses those beside it.

The accuracy guardrail compares the traced program's own loss and gradients: the same trainer
without an optimizer returns them (`traced_gradients`).
"""

from __future__ import annotations

from typing import Any

import torch

from tpu_tuner.core.errors import WorkloadError
from tpu_tuner.devices.base import Backend
from tpu_tuner.execution.host_read import read_total
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.model.workloads.workload import Workload, call_model

# A step is execution/step.py's PreparedStep (Any here: that module calls this one as it builds it).


def trace_whole_step(step: Any, workload: Workload, backend: Backend, candidate: Candidate) -> None:
    """Make `step` run as one traced program: `step.run` the traced step (its loss out), `step.read`
    a read of every parameter the update wrote. Raises WorkloadError for what it cannot trace."""
    tracer = _tracer(workload, backend)
    group = _adamw_group(step.optimizer, workload)
    beta1, beta2 = group["betas"]
    adamw = tracer.AdamW(
        lr=float(group["lr"]),
        weight_decay=float(group["weight_decay"]),
        beta1=float(beta1),
        beta2=float(beta2),
        eps=float(group["eps"]),
        use_bfloat16_moments=all(p.dtype == torch.bfloat16 for p in step.model.parameters()),
    )
    trainer = _trainer(tracer, step, workload, backend, adamw)
    with candidate.step(backend):  # traced under the setting's step contexts (autocast)
        traced = trainer.make_compiled_train_step(step.batch)

    def run() -> Any:
        with candidate.step(backend):
            return traced(step.batch)

    step.run = run
    # The trainer's current parameters (its update may hand back new tensors), not the loss.
    step.read = lambda output: read_total([p.detach() for p in trainer.params.values()])


def traced_gradients(step: Any, workload: Workload, backend: Backend, candidate: Candidate) -> torch.Tensor:
    """The traced program's loss, its gradients left in the parameters' ``.grad`` (the trainer
    without an optimizer: forward and backward traced as they run in the whole step)."""
    trainer = _trainer(_tracer(workload, backend), step, workload, backend, None)
    with candidate.step(backend):
        traced = trainer.make_compiled_train_step(step.batch)
        return traced(step.batch)


# AdamW settings the device's AdamW has no way to take: refused rather than silently dropped.
_UNTAKEN = ("amsgrad", "maximize")
_HYPERPARAMETERS = ("lr", "betas", "eps", "weight_decay")


def _adamw_group(optimizer: Any, workload: Workload) -> dict[str, Any]:
    """The user's one set of AdamW hyperparameters, which the device's AdamW takes for every
    parameter; WorkloadError naming what it cannot take (another optimizer, groups that differ)."""
    if not isinstance(optimizer, torch.optim.AdamW):
        name = type(optimizer).__name__
        raise WorkloadError(
            f"compile_scope = step takes an AdamW optimizer (the device's own), not {name}", workload.source
        )
    groups = optimizer.param_groups
    for option in _UNTAKEN:
        if any(group.get(option) for group in groups):
            raise WorkloadError(f"compile_scope = step: the device's AdamW has no {option}", workload.source)
    differing = [key for key in _HYPERPARAMETERS if len({repr(group[key]) for group in groups}) > 1]
    if differing:
        raise WorkloadError(
            f"compile_scope = step: the device's AdamW takes one set of hyperparameters, and the parameter "
            f"groups differ in {', '.join(differing)}",
            workload.source,
        )
    return dict(groups[0])


def _tracer(workload: Workload, backend: Backend) -> Any:
    if not workload.is_training or workload.loss_fn is None:
        raise WorkloadError("compile_scope = step traces a training step: this workload has no loss", workload.source)
    tracer = backend.step_tracer()
    if tracer is None:
        raise WorkloadError(
            f"compile_scope = step needs a device that traces a whole step (TorchTPU's SingleTraceTrainer); "
            f"{backend.kind} has none",
            workload.source,
        )
    return tracer


def _trainer(tracer: Any, step: Any, workload: Workload, backend: Backend, optimizer: Any) -> Any:
    loss_fn = workload.loss_fn
    assert loss_fn is not None

    def compute_loss(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # The batch is handed in as (inputs, target): the target is a graph input (make_fx refuses
        # a real tensor captured from outside the trace).
        return loss_fn(call_model(model, args[0]), args[1])

    # transformers' gradient checkpointing hooks the embeddings to call requires_grad_(), which a
    # torch.func transform refuses (a v5e chip); the traced step takes its gradients itself.
    disable = getattr(step.model, "disable_input_require_grads", None)
    if callable(disable):
        try:
            disable()
        except AttributeError:
            pass  # no such hook: gradient checkpointing was never turned on
    compile_backend = backend.default_compile_backend()
    return tracer.SingleTraceTrainer(
        step.model,
        optimizer,
        compile_fn=lambda graph: torch.compile(graph, backend=compile_backend),
        compute_loss_fn=compute_loss,
    )
