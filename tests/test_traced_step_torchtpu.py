"""The guardrail's side of `compile_scope = step` against the released torch-tpu, on a CPU: its
SingleTraceTrainer without an optimizer traces the loss and the backward with `torch.func` and
`make_fx` on any device, so the traced program's loss and gradients are checked against the eager
step's here (its AdamW takes device tensors only, so the whole step with the update runs on a
chip: docs/torchtpu.md). Runs in the TorchTPU environment (`pytest -m torchtpu`, as
tests/test_torchtpu_contract.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.torchtpu

TINY = Path(__file__).parent / "fixtures" / "tiny_gpt.py"

CODE = """
import torch, torch_tpu
from tpu_tuner.devices.cpu import CpuBackend
from tpu_tuner.execution.accuracy import capture
from tpu_tuner.execution.step import prepare_step
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.model.workloads.loader import load_workload

CpuBackend.step_tracer = lambda self: torch.tpu.optimizers  # the CPU given torch-tpu's tracer
workload, backend = load_workload({tiny!r}), CpuBackend()
traced_candidate = Candidate(execution="inductor", compile_scope="step")
step = prepare_step(workload, backend, Candidate(execution="inductor"), 2, 16)
traced = capture(step, workload, backend, traced_candidate)
eager = capture(prepare_step(workload, backend, Candidate(), 2, 16), workload, backend, Candidate())
loss = float((traced.parts["loss"] - eager.parts["loss"]).abs())
grads = float((traced.parts["gradients"] - eager.parts["gradients"]).abs().max())
scale = float(eager.parts["gradients"].abs().max())
print(loss, grads, scale)
"""


def test_the_traced_programs_loss_and_gradients_are_the_eager_steps() -> None:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CODE.format(tiny=str(TINY)))],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TPU_SKIP_MDS_QUERY": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    loss, grads, scale = map(float, result.stdout.strip().splitlines()[-1].split())
    assert loss <= 1e-5 and scale > 0 and grads <= 1e-4 * scale, (loss, grads, scale)
