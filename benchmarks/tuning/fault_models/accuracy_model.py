"""Fault model for benchmarks/tuning/failure_learning.py: outputs 50% off the fp32 reference whenever
the step runs on one intra-op thread (bad value: intra_op_threads = 1), far beyond the default
tolerance (1%), so the trial fails the accuracy guardrail; right under every other setting (bf16
autocast included: its own rounding stays well inside the tolerance).

Why threads and not matmul precision "medium": on a CPU whose fp32 matmuls "medium" leaves
unchanged, the precision agent rejects "medium" unmeasured, so a fault under it would never be
reached; "1" thread is searched on every host with two or more usable cores (the knob drops
counts at or above the cores, so on a 1-core host it is not searched and the model runs right).

Benchmark convention, inference: batch 64 of 256 features through a 256-512-256 MLP. The thread
count is read in a custom operator at step time (`torch.library.custom_op`): dynamo and inductor
treat it as an opaque call, so it runs inside every compiled graph, fullgraph included, and sees
the `torch.set_num_threads` the trial set, as a kernel with a broken single-thread path would.
"""

import torch
from torch import nn

OP = "skew_on_one_thread"


def _define_fault() -> None:
    """Register faultbench::skew_on_one_thread once per process (tpu-tune imports a model file
    under a fresh module name each time it loads it)."""
    if hasattr(torch.ops.faultbench, OP):
        return

    @torch.library.custom_op(f"faultbench::{OP}", mutates_args=())
    def fault(x: torch.Tensor) -> torch.Tensor:
        if torch.get_num_threads() == 1:
            return x * 1.5  # a wrong result, not rounding: relative error 0.5
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
        return getattr(torch.ops.faultbench, OP)(self.fc2(hidden))


def get_init_inputs():
    return [256]


def get_inputs():
    return [torch.randn(64, 256)]
