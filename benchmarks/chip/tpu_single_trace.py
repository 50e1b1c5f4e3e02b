"""A lever no knob makes yet: the whole training step traced into one program by TorchTPU.

torch-tpu 0.2.0 ships `torch.tpu.optimizers.SingleTraceTrainer` (experimental): `make_fx` of the
forward, the backward (`torch.func.grad_and_value`) and a functional optimizer's update, compiled
as one graph, "reducing interpreter overhead and enabling better fusion" (its docstring); its
`AdamW` keeps the moments in bf16 by default. That is how JAX runs a step (one jitted program),
where `tpu` compile runs the forward and backward as programs and the update eagerly. The patch
replaces a built step's run with the trainer's step at the user's AdamW hyperparameters, compiled
by the device's compile backend, traced under the setting's step contexts (autocast, splash), and
its read with a read of every updated parameter (what ends a timed block: execution/timer.py).
"""

from __future__ import annotations

from typing import Any


def trace_whole_step(step: Any, backend: Any, workload: Any, candidate: Any) -> None:
    """Patch `step` (a PreparedStep of a training workload whose optimizer is AdamW) to run as one
    traced program of TorchTPU's SingleTraceTrainer. ValueError names what it cannot take."""
    import torch

    from tpu_tuner.model.workloads.workload import call_model

    if not workload.is_training or workload.loss_fn is None:
        raise ValueError("the whole step traced is a training step's lever: this workload has no loss")
    if not isinstance(step.optimizer, torch.optim.AdamW):
        raise ValueError(f"the whole step traced takes AdamW (TorchTPU's own), not {type(step.optimizer).__name__}")
    group = step.optimizer.param_groups[0]
    beta1, beta2 = group["betas"]
    optimizers = torch.tpu.optimizers  # type: ignore[attr-defined]  # torch-tpu's device module
    adamw = optimizers.AdamW(
        lr=float(group["lr"]), weight_decay=float(group["weight_decay"]), beta1=beta1, beta2=beta2, eps=group["eps"]
    )
    loss_fn = workload.loss_fn

    def compute_loss(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # The trainer hands its inputs as args: here (inputs, target), so the target is a graph
        # input (make_fx refuses a real tensor captured from outside the trace).
        return loss_fn(call_model(model, args[0]), args[1])

    trainer = optimizers.SingleTraceTrainer(
        step.model,
        adamw,
        # torch.compile of the traced graph (the public way to reach the device's backend).
        compile_fn=lambda graph: torch.compile(graph, backend=backend.default_compile_backend()),
        compute_loss_fn=compute_loss,
    )
    batch = step.batch  # (inputs, target), on the device
    with candidate.step(backend):
        traced = trainer.make_compiled_train_step(batch)

    def run() -> Any:
        with candidate.step(backend):
            return traced(batch)

    def read(_: Any) -> float:
        # Every parameter the update wrote (the trainer's own: its step may return new tensors).
        return float(torch.stack([p.detach().float().sum() for p in trainer.params.values()]).sum())

    step.run, step.read = run, read
