"""Recurrent layers' FLOPs: tpu-tune's count of the fused kernels against the decomposed path
and a hand count (issue 12, item 6).

On CPU `nn.LSTM` runs as fused `aten::mkldnn_rnn_layer` kernels that torch's FLOP counter alone
cannot see (GRU and RNN run decomposed on CPU either way); with oneDNN switched off the same module
decomposes into mm/addmm, which it counts. About 4 minutes on a 2-core CPU (the decomposed
training steps dominate).
The hand count is the matmul-only convention of docs/flops.md: per layer and direction,
2 x tokens x (gates x hidden x (input + recurrent width)), plus the LSTM projection.

    python benchmarks/profiling/flops_recurrent.py
"""

from __future__ import annotations

import argparse
import warnings

import torch
from torch import nn

from tpu_tuner.metrics.flops import count_step

GATES = {nn.LSTM: 4, nn.GRU: 3, nn.RNN: 1}


def hand_count(module: nn.RNNBase, tokens: int) -> int:
    """Forward matmul FLOPs of `module` over `tokens` (time steps x batch)."""
    gates, hidden = GATES[type(module)], module.hidden_size
    recurrent = module.proj_size or hidden
    directions = 2 if module.bidirectional else 1
    total = 0
    for layer in range(module.num_layers):
        width_in = module.input_size if layer == 0 else recurrent * directions
        per_direction = 2 * tokens * gates * hidden * (width_in + recurrent)
        if module.proj_size:
            per_direction += 2 * tokens * hidden * module.proj_size
        total += directions * per_direction
    return total


def counted(module: nn.Module, x: torch.Tensor, fused: bool, training: bool) -> int:
    def step() -> None:
        out = module(x)[0]
        if training:
            out.sum().backward()

    with torch.backends.mkldnn.flags(enabled=fused):
        return count_step(step).total


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # no options: --help says what it runs
    warnings.simplefilter("ignore", UserWarning)  # oneDNN's TF32 notice and RNN weight-layout notes
    torch.manual_seed(0)
    cases = {
        # KernelBench level 3's LSTM shapes: 6 layers, 128 -> 256, batch 10 x 512 steps.
        "LSTM 6 layers 128->256, batch 10 x 512": (nn.LSTM(128, 256, 6, batch_first=True), (10, 512, 128)),
        "LSTM 2 layers bidirectional proj 64": (
            nn.LSTM(128, 256, 2, batch_first=True, bidirectional=True, proj_size=64),
            (10, 512, 128),
        ),
        "GRU 6 layers 128->256, batch 10 x 512": (nn.GRU(128, 256, 6, batch_first=True), (10, 512, 128)),
        "RNN tanh 3 layers bidirectional": (nn.RNN(128, 256, 3, batch_first=True, bidirectional=True), (10, 512, 128)),
    }
    print(
        f"{'module':42} {'default (counted)':>18} {'decomposed':>18} {'hand count':>18} "
        f"{'train default':>18} {'train decomposed':>18}"
    )
    for name, (module, shape) in cases.items():
        x = torch.randn(*shape, requires_grad=True)
        tokens = shape[0] * shape[1]
        row = [
            counted(module, x, True, False),
            counted(module, x, False, False),
            hand_count(module, tokens),
            counted(module, x, True, True),
            counted(module, x, False, True),
        ]
        print(f"{name:42} " + " ".join(f"{value:>18,}" for value in row))


if __name__ == "__main__":
    main()
