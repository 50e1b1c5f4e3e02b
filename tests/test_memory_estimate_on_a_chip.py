"""Issue 54, item 7: the memory estimate for a device whose tensors fake mode cannot hold. On a v5e
chip, moving the fake model failed ("_apply(): Couldn't swap Embedding.weight") and every trial
ran unestimated. A fake chip reproduces it (fake tensors cannot go to its device); the estimate
then traces the step on CPU fake tensors, which hold the same bytes."""

from __future__ import annotations

import torch
from conftest import FIXTURES

from tpu_tuner.devices.cpu import CpuBackend
from tpu_tuner.execution.memory_estimate import estimate_step_memory, stand_in
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.model.workloads.loader import load_workload

GPT = FIXTURES / "tiny_gpt.py"


class FakeChip(CpuBackend):
    """A CPU whose tensors live on a device fake mode cannot place tensors on."""

    fake_tensor_device: str | None = None

    @property
    def device(self) -> torch.device:
        return torch.device("privateuseone")

    def free_heap_bytes(self) -> int | None:
        return None  # the chip's allocator keeps nothing freed: no heap model

    def memory_in_use_bytes(self) -> int | None:
        return 0


class StandsIn(FakeChip):
    fake_tensor_device = "cpu"


def test_a_device_fake_tensors_cannot_reach_gets_no_estimate_without_a_stand_in() -> None:
    estimate = estimate_step_memory(load_workload(GPT), FakeChip(), Candidate())
    assert estimate.step_bytes is None and "does not run on fake tensors" in (estimate.reason or "")


def test_the_stand_in_traces_the_step_on_cpu_with_the_same_bytes() -> None:
    workload = load_workload(GPT)
    on_chip = estimate_step_memory(workload, StandsIn(), Candidate(autocast="bfloat16"))
    on_cpu = estimate_step_memory(workload, CpuBackend(), Candidate(autocast="bfloat16"))
    assert on_chip.reason is None and on_chip.step_bytes == on_cpu.step_bytes > 0
    assert on_chip.peak_bytes == on_chip.step_bytes  # nothing in use, no heap kept
    fp32 = estimate_step_memory(workload, StandsIn(), Candidate())
    assert fp32.step_bytes is not None and fp32.step_bytes > on_chip.step_bytes  # autocast reached the stand-in
    chip = StandsIn()
    assert stand_in(chip).device == torch.device("cpu") and stand_in(chip).kind == "cpu"
    assert stand_in(chip).free_heap_bytes() is None  # the rest is the chip's own


def test_torchtpu_estimates_on_cpu_with_the_math_attention() -> None:
    """The estimates of a v5e chip's measured peaks were within 14% with the math attention (which
    keeps the attention matrix for the backward) and not with CPU's fused kernel (docs/torchtpu.md)."""
    from tpu_tuner.devices.torchtpu import TorchTpuBackend

    assert TorchTpuBackend.fake_tensor_device == "cpu" and TorchTpuBackend.runs_ahead
    chip = object.__new__(TorchTpuBackend)  # no chip here: only its tables and the context
    assert torch.backends.cuda.flash_sdp_enabled()
    with chip.estimate_kernels():
        assert not torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
    assert torch.backends.cuda.flash_sdp_enabled()
