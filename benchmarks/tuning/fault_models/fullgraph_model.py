"""Fault model for benchmarks/tuning/failure_learning.py: a data-dependent branch on `.item()` in the
forward, a graph break that plain `torch.compile` splits around (two graphs, the step runs) and
that `fullgraph=True` refuses at tracing (bad value: compile_options = fullgraph, the only
setting that asks for one graph); eager and every other compile setting run and are accurate.

Benchmark convention, inference: batch 64 of 4096 features, a small linear bottleneck
(4096-16-4096) between two chains of cheap elementwise ops. The chains are what makes inductor
worth its compile here (eager runs each op as a pass over the activations; inductor fuses each
chain into one), so the search spends its budget under inductor, among its compile options,
where the fault is: a model where inductor loses would leave fullgraph unreached and the
benchmark with nothing to count.
"""

import torch
from torch import nn

CHAIN = 16  # elementwise steps per chain (3 cheap ops each: eager makes a pass over memory per op)


def _chain(h: torch.Tensor) -> torch.Tensor:
    for _ in range(CHAIN):
        h = (h * 0.9 + 0.05).clamp(-4.0, 4.0)
    return h


class Model(nn.Module):
    def __init__(self, width: int = 4096) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width // 256)  # small: the elementwise chains dominate the step
        self.out = nn.Linear(width // 256, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = _chain(x)
        # A Python branch on a tensor's value: dynamo cannot trace it into the graph (no
        # capture of scalar outputs by default), so the graph breaks here.
        if hidden.mean().item() > 0:
            hidden = torch.relu(self.fc(hidden))
        else:
            hidden = torch.tanh(self.fc(hidden))
        # The chain in fp32 under bf16 autocast too: rounding every op of it to bf16 put the
        # output 1.3% off the fp32 reference, a second (accuracy) fault the model must not have.
        return _chain(self.out(hidden).float())


def get_init_inputs():
    return [4096]


def get_inputs():
    return [torch.randn(64, 4096)]
