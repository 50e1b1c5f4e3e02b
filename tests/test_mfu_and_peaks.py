"""MFU arithmetic from known numbers, and the published peak tables."""

from __future__ import annotations

import pytest

from tpu_tuner.hardware import TPU_CHIPS, gpu_spec_for_name, tpu_chip_for_name
from tpu_tuner.metrics.mfu import achieved_flops_per_s, mfu
from tpu_tuner.metrics.timing import TimingStats


def test_mfu_from_known_numbers() -> None:
    # 459 TFLOP/s per v5p chip; 4 chips; a step of 918 TFLOP in 1 s uses half of them.
    assert mfu(918e12, 1.0, 459e12, devices=4) == pytest.approx(0.5)
    assert achieved_flops_per_s(1e12, 0.25) == 4e12
    with pytest.raises(ValueError):
        mfu(1.0, 0.0, 1.0)


@pytest.mark.parametrize(
    ("name", "generation", "bf16_per_device"),
    [
        ("TPU v4", "v4", 275e12),
        ("TPU v5e", "v5e", 197e12),
        ("TPU v5 lite", "v5e", 197e12),
        ("TPU v5p", "v5p", 459e12),
        ("TPU v6e", "v6e", 918e12),
        ("TPU v6 lite", "v6e", 918e12),
        ("TPU7x", "tpu7x", 1153.5e12),  # two devices per chip share the 2307 TFLOP/s
    ],
)
def test_tpu_table(name: str, generation: str, bf16_per_device: float) -> None:
    chip = tpu_chip_for_name(name)
    assert chip is not None and chip.generation == generation
    assert chip.bf16_flops_per_device == pytest.approx(bf16_per_device)


def test_tpu_memory_and_slice_naming() -> None:
    assert TPU_CHIPS["v5p"].hbm_bytes_per_chip == 95 * 1024**3
    assert TPU_CHIPS["tpu7x"].hbm_bytes_per_device == 96 * 1024**3
    assert TPU_CHIPS["v5p"].slice_name_counts_cores and not TPU_CHIPS["v5e"].slice_name_counts_cores
    assert tpu_chip_for_name("NVIDIA H100") is None


@pytest.mark.parametrize(
    ("name", "spec", "bf16_tflops"),
    [
        ("NVIDIA H200", "H200", 989.4),
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.4),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB", 312),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB", 312),
    ],
)
def test_gpu_table(name: str, spec: str, bf16_tflops: float) -> None:
    found = gpu_spec_for_name(name)
    assert found is not None and found.name == spec and found.tflops["bfloat16"] == bf16_tflops
    assert found.tflops["float32"] < found.tflops["tf32"] < found.tflops["bfloat16"]


def test_unknown_gpu_has_no_table_entry() -> None:
    assert gpu_spec_for_name("Some Future GPU") is None


def test_timing_stats_spread() -> None:
    stats = TimingStats.from_samples([float(x) for x in range(1, 12)])
    assert stats.median == 6 and stats.p10 == 2 and stats.p90 == 10 and stats.count == 11
    with pytest.raises(ValueError):
        TimingStats.from_samples([])
