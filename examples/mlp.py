"""A plain MLP in the widespread benchmark convention: class Model, get_inputs, get_init_inputs.

Inference workload: batch 256 of 1024 features through 3 hidden layers of 2048.
Run: tpu-tune profile examples/mlp.py
"""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, in_features: int, hidden: int, layers: int, out_features: int) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        width = in_features
        for _ in range(layers):
            blocks += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        blocks.append(nn.Linear(width, out_features))
        self.net = nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def get_init_inputs():
    return [1024, 2048, 3, 1000]


def get_inputs():
    return [torch.randn(256, 1024)]
