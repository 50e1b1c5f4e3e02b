"""Published per-device peak numbers for TPUs and GPUs (dense, no sparsity).

Sources, all public:

* TPUs: Google Cloud's TPU system-architecture pages, one per generation
  (https://cloud.google.com/tpu/docs/v4, .../v5e, .../v5p, .../v6e, .../tpu7x): bf16 TFLOP/s,
  HBM capacity and bandwidth, ICI bandwidth and torus shape per chip.
* GPUs: NVIDIA's datasheets (https://www.nvidia.com/en-us/data-center/h200/, .../h100/,
  .../a100/, .../l4/, .../v100/): dense figures, without the 2:4 sparsity speed-up the headline
  tensor-core numbers include.

Peaks are per *device* as PyTorch sees it: a TPU7x chip holds two devices, so its per-device
bf16 peak is half the chip's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TERA = 1e12
GIGA = 1e9


@dataclass(frozen=True)
class TpuChip:
    """One TPU generation's per-chip figures."""

    generation: str
    bf16_tflops_per_chip: float
    hbm_bytes_per_chip: float
    hbm_gbytes_per_s: float
    ici_gbytes_per_s: float | None  # per chip, bidirectional; None where Google does not state it
    devices_per_chip: int
    torus_dims: int  # 2 for a 2D torus, 3 for a 3D torus
    max_chips: int
    slice_name_counts_cores: bool  # "v5p-256" counts TensorCores (2 per chip), "v5e-16" chips

    @property
    def bf16_flops_per_device(self) -> float:
        return self.bf16_tflops_per_chip * TERA / self.devices_per_chip

    @property
    def hbm_bytes_per_device(self) -> float:
        return self.hbm_bytes_per_chip / self.devices_per_chip

    @property
    def hbm_bytes_per_s_per_device(self) -> float:
        """Each device's share of the chip's HBM bandwidth: a TPU7x device has half the chip's HBM,
        and the stacks' bandwidth with it."""
        return self.hbm_gbytes_per_s * GIGA / self.devices_per_chip


GIB = 1024**3

TPU_CHIPS: dict[str, TpuChip] = {
    "v4": TpuChip("v4", 275, 32 * GIB, 1200, None, 1, 3, 4096, True),
    "v5e": TpuChip("v5e", 197, 16 * GIB, 819, 400, 1, 2, 256, False),
    "v5p": TpuChip("v5p", 459, 95 * GIB, 2765, 1200, 1, 3, 8960, True),
    "v6e": TpuChip("v6e", 918, 32 * GIB, 1638, 800, 1, 2, 256, False),
    "tpu7x": TpuChip("tpu7x", 2307, 192 * GIB, 7380, 1200, 2, 3, 9216, False),
}

# Device-name spellings seen from TPU runtimes, mapped to a generation key above.
_TPU_NAME_PATTERNS: list[tuple[str, str]] = [
    (r"7x|\bv7\b|ironwood", "tpu7x"),  # torch-tpu 0.2.0 names the chip "TPU v7"
    (r"v6\s*e|v6\s*lite|trillium", "v6e"),
    (r"v5\s*p", "v5p"),
    (r"v5\s*e|v5\s*lite", "v5e"),
    (r"v4", "v4"),
]


def tpu_chip_for_name(device_name: str) -> TpuChip | None:
    """The TPU generation a device name such as "TPU v5e" or "TPU v5 lite" refers to."""
    lowered = device_name.lower()
    for pattern, key in _TPU_NAME_PATTERNS:
        if re.search(pattern, lowered):
            return TPU_CHIPS[key]
    return None


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model's dense peak TFLOP/s per dtype and HBM bandwidth."""

    name: str
    tflops: dict[str, float]  # keys: float32, tf32, bfloat16, float16
    hbm_gbytes_per_s: float


# Ordered: the first pattern that matches the CUDA device name wins (H100 PCIe before H100).
GPU_SPECS: list[tuple[str, GpuSpec]] = [
    (r"h200", GpuSpec("H200", {"float32": 67, "tf32": 494.7, "bfloat16": 989.4, "float16": 989.4}, 4800)),
    (r"h100.*pcie", GpuSpec("H100 PCIe", {"float32": 51, "tf32": 378, "bfloat16": 756, "float16": 756}, 2000)),
    (r"h100", GpuSpec("H100 SXM", {"float32": 67, "tf32": 494.7, "bfloat16": 989.4, "float16": 989.4}, 3350)),
    (r"a100.*80", GpuSpec("A100 80GB", {"float32": 19.5, "tf32": 156, "bfloat16": 312, "float16": 312}, 2039)),
    (r"a100", GpuSpec("A100 40GB", {"float32": 19.5, "tf32": 156, "bfloat16": 312, "float16": 312}, 1555)),
    (r"\bl4\b", GpuSpec("L4", {"float32": 30.3, "tf32": 60, "bfloat16": 121, "float16": 121}, 300)),
    (r"v100", GpuSpec("V100", {"float32": 15.7, "float16": 125}, 900)),
]


def gpu_spec_for_name(device_name: str) -> GpuSpec | None:
    """The datasheet entry for a CUDA device name such as "NVIDIA H200"."""
    lowered = device_name.lower()
    for pattern, spec in GPU_SPECS:
        if re.search(pattern, lowered):
            return spec
    return None
