"""Fault model for benchmarks/tuning/failure_learning.py: a training step that asks for a petabyte
whenever it runs as 4 micro-batches (bad value: micro_batches = 4), an allocation failure (kind
"oom") under any --trial-memory-gb and on any host; 1 and 2 micro-batches run and are accurate.

Native contract, training: batch 8 of 256 features through a 256-512-256 MLP, MSE loss, AdamW.
The knob is read from the batch the loss sees: micro-batching slices the batch along its first
dimension, so 4 micro-batches hand `loss` BATCH_SIZE // 4 rows. The fault sits in `loss`, which
tpu-tune runs eagerly after the (possibly compiled) forward, so it is the same under every
execution mode; the request is never touched, so it cannot take the host's memory when it
does not fail.
"""

import torch
from torch import nn

BATCH_SIZE = 8
WIDTH = 256
PETABYTE = 1 << 50  # beyond any address-space limit, and any host's RAM and swap


class Model(nn.Module):
    def __init__(self, width: int = WIDTH) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def build_model() -> nn.Module:
    return Model()


def make_batch(batch_size: int, seq_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, WIDTH), torch.randn(batch_size, WIDTH)


def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if target.shape[0] == BATCH_SIZE // 4:
        # Activations "sized for the whole batch" allocated per micro-batch: the bug a
        # gradient-accumulation path can hide. Raises RuntimeError "can't allocate memory".
        torch.empty(PETABYTE, dtype=torch.uint8)
    return nn.functional.mse_loss(output, target)
