"""The chaos benchmark's model (benchmarks/studies/chaos.py): trials of a second or two whose speed depends on
the settings in a known way, so the best found can be checked against the known best.

Step time: 4 ms, plus 6 ms without bf16 autocast, plus 4 ms unless the step runs on one intra-op
thread (the step sleeps: the cores do not limit it, so a loaded host changes no ranking). bf16
changes the output by bf16 rounding only, within the accuracy tolerance. The best setting is bf16
autocast on one thread (4 ms); the four settings are 4, 8, 10 and 14 ms apart from noise.
"""

import time

import torch
from torch import nn

BASE_S, FP32_S, THREADS_S = 0.004, 0.006, 0.004
BEST = {"autocast": "bfloat16", "intra_op_threads": "1"}


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fp32 = not torch.is_autocast_enabled("cpu")
        time.sleep(BASE_S + (FP32_S if fp32 else 0.0) + (THREADS_S if torch.get_num_threads() != 1 else 0.0))
        return self.fc(x).float()


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(4, 8)]
