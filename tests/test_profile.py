"""The profile API on tiny workloads: figures that agree with each other and with the formula."""

from __future__ import annotations

import json

import pytest
from conftest import FIXTURES

import tpu_tuner
from tpu_tuner.core.errors import UserInputError, WorkloadError
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.metrics.mfu import mfu


def test_profile_of_a_training_step(fast_settings) -> None:
    result = tpu_tuner.profile(FIXTURES / "tiny_gpt.py", device="cpu", settings=fast_settings)
    assert result.workload["step"] == "training step"
    assert result.timing.count >= 10 and result.timing.p10 <= result.timing.median <= result.timing.p90
    # A decoder LM: the counted FLOPs and the 6N + 12LHQT formula agree exactly.
    assert result.flops.counted_per_step == result.flops.model_per_step > 0
    assert "6N + 12LHQT" in result.flops.model_formula
    assert "full attention" in result.flops.attention_convention
    # MFU divides by the fastest dtype's peak, whatever the run's own dtype (docs/mfu.md).
    assert (result.peak_flops_per_s, result.peak_dtype) == result.device.peak.fastest()
    assert result.mfu == pytest.approx(mfu(result.flops.model_per_step, result.timing.median, result.peak_flops_per_s))
    assert result.memory.peak_bytes and result.memory.peak_bytes > 0
    assert result.operators and result.operators[0].self_ms_per_step > 0
    assert 0 < sum(op.share for op in result.operators) <= 1 + 1e-9  # shares of all self time
    assert result.verdict.bound in {"compute-bound", "memory-bound", "overhead-bound", "below-roofline"}
    assert result.warmup.compiles["torch_compile_graphs"] == 0  # eager compiles nothing


def test_profile_serialises_to_json(fast_settings) -> None:
    result = tpu_tuner.profile(FIXTURES / "tiny_mlp_benchmark.py", device="cpu", settings=fast_settings)
    data = json.loads(result.to_json())
    assert data["workload"]["convention"] == "benchmark"
    assert data["timing"]["median"] == result.timing.median
    assert data["device"]["peak"]["source"].startswith("measured roofline probe")
    assert data["candidate"] == Candidate().to_dict()
    # No transformer declared: the model FLOPs are the counted ones, and the report says so.
    assert data["flops"]["model_per_step"] == data["flops"]["counted_per_step"] == 2 * 2 * 4 * 16 * 32


def test_bf16_candidate_uses_the_fastest_dtypes_peak(fast_settings) -> None:
    """MFU divides by the fastest dtype's peak (docs/mfu.md): bf16 on a host with AMX, fp32 on one
    without (an AVX-512F host's bf16 matmuls run ~3x slower than fp32): the host decides."""
    candidate = Candidate(autocast="bfloat16")
    result = tpu_tuner.profile(FIXTURES / "tiny_gpt.py", device="cpu", candidate=candidate, settings=fast_settings)
    peaks = result.device.peak.flops_per_s
    assert result.peak_dtype == max(peaks, key=peaks.__getitem__)
    assert result.peak_flops_per_s == peaks[result.peak_dtype] and "bfloat16" in peaks


def test_torch_compile_is_warmed_up_before_timing(fast_settings) -> None:
    candidate = Candidate(execution="aot_eager")
    result = tpu_tuner.profile(
        FIXTURES / "tiny_mlp_benchmark.py", device="cpu", candidate=candidate, settings=fast_settings
    )
    assert result.warmup.compiles["torch_compile_graphs"] >= 1
    assert result.warmup.settled
    assert result.compiles_while_timing["torch_compile_graphs"] == 0
    assert result.warmup.first_call_seconds > result.timing.median  # the compile is in the first call


def test_forward_failure_is_a_workload_error(fast_settings) -> None:
    with pytest.raises(WorkloadError, match="first step failed: RuntimeError") as info:
        tpu_tuner.profile(FIXTURES / "bad_forward.py", device="cpu", settings=fast_settings)
    assert "bad_forward.py" in str(info.value)


def test_bad_sizes_are_rejected(fast_settings) -> None:
    with pytest.raises(UserInputError, match="batch size must be a positive integer"):
        tpu_tuner.profile(FIXTURES / "tiny_gpt.py", device="cpu", batch_size=0, settings=fast_settings)
