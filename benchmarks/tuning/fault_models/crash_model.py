"""Fault model for benchmarks/tuning/failure_learning.py: the trial worker dies with SIGSEGV whenever
bf16 autocast is on (bad value: autocast = bfloat16); every other setting runs and is accurate.

Benchmark convention, inference: batch 64 of 256 features through a 256-512-256 MLP (a few ms a
step on CPU). The forward reads the autocast state (dynamo traces that read, and guards on it)
and, under bf16, calls a custom operator (`torch.library.custom_op`) that kills the process:
dynamo and inductor treat the operator as an opaque call, so it runs at step time under every
execution mode, fullgraph included, as a kernel that crashes in bf16 would. The operator itself
cannot read the state: a compiled graph has autocast's casts baked in and runs with autocast off
(seen: inductor and aot_eager trials under bf16 ran and did not crash).
"""

import os
import signal

import torch
from torch import nn

OP = "segfault"


def _define_fault() -> None:
    """Register faultbench::segfault once per process (tpu-tune imports a model file under a
    fresh module name each time it loads it)."""
    if hasattr(torch.ops.faultbench, OP):
        return

    @torch.library.custom_op(f"faultbench::{OP}", mutates_args=())
    def fault(x: torch.Tensor) -> torch.Tensor:
        os.kill(os.getpid(), signal.SIGSEGV)  # what a segfaulting bf16 kernel does to its process
        return x.clone()

    @fault.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:  # shapes for tracing: the op returns its input's
        return torch.empty_like(x)


_define_fault()


class Model(nn.Module):
    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.fc1(x))
        if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16:
            hidden = getattr(torch.ops.faultbench, OP)(hidden)
        return self.fc2(hidden)


def get_init_inputs():
    return [256]


def get_inputs():
    return [torch.randn(64, 256)]
