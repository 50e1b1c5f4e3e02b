"""The chaos benchmark's model (benchmarks/chaos.py): trials of a second or two whose speed depends on
the settings in a known way, so the best found can be checked against the known best.

Step time: 12 ms at matmul precision "highest", 8 ms at "high", 3 ms at "medium"; bf16 autocast
adds 6 ms. Only "high" changes the output (by +50%, beyond any tolerance): the best feasible setting
is "medium" without autocast (any thread count: the step sleeps, the cores do not limit it).
"""

import time

import torch
from torch import nn

SLEEP_S = {"highest": 0.012, "high": 0.008, "medium": 0.003}
AUTOCAST_S = 0.006
BEST = {"matmul_precision": "medium", "autocast": "none"}


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        precision = torch.get_float32_matmul_precision()
        time.sleep(SLEEP_S[precision] + (AUTOCAST_S if torch.is_autocast_enabled("cpu") else 0.0))
        out = self.fc(x).float()
        return out * 1.5 if precision == "high" else out


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(4, 8)]
