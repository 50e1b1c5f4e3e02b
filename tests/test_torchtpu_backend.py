"""The TorchTPU adapter against a stand-in of the torch.tpu API (no TPU on this machine).

The stand-in has the names FACTS.md documents (EagerMode members, get_device_name,
get_device_properties, _get_cache_stats); the test checks that tpu-tune maps its candidates and
peaks onto them, not that a TPU runs.
"""

from __future__ import annotations

import enum
import sys
import types

import pytest
import torch

from tpu_tuner.backends.torchtpu import EAGER_MODE_ENV, TorchTpuBackend
from tpu_tuner.candidate import Candidate


class EagerMode(enum.Enum):
    DEFER_NEVER = 0
    DEFER_NEVER_AND_LAUNCH_BLOCKING = 1
    DEFER_AND_FUSE = 2


@pytest.fixture
def fake_tpu(monkeypatch):
    tpu = types.SimpleNamespace(
        EagerMode=EagerMode,
        eager_mode=EagerMode.DEFER_NEVER,
        get_device_name=lambda: "TPU v5p",
        get_device_properties=lambda: types.SimpleNamespace(total_memory=95 * 1024**3),
        _get_cache_stats=lambda: {"requests": 10, "hits": 7, "misses": 3},
    )
    monkeypatch.setitem(sys.modules, "torch_tpu", types.ModuleType("torch_tpu"))
    monkeypatch.setattr(torch, "tpu", tpu, raising=False)
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: 4)
    return tpu


def test_peak_comes_from_the_spec_table(fake_tpu) -> None:
    info = TorchTpuBackend().info()
    assert (info.kind, info.name, info.count) == ("tpu", "TPU v5p", 4)
    assert info.peak.flops_per_s["bfloat16"] == 459e12
    assert info.peak.memory_bytes_per_s == 2765e9
    assert "Google TPU spec table (v5p)" in info.peak.source
    assert info.memory_bytes == 95 * 1024**3


def test_eager_mode_and_precision_are_applied_and_restored(fake_tpu) -> None:
    backend = TorchTpuBackend()
    before = torch.get_float32_matmul_precision()
    with backend.applied(Candidate(execution="eager:defer_and_fuse", matmul_precision="medium")):
        assert fake_tpu.eager_mode is EagerMode.DEFER_AND_FUSE
        assert torch.get_float32_matmul_precision() == "medium"
    assert fake_tpu.eager_mode is EagerMode.DEFER_NEVER
    assert torch.get_float32_matmul_precision() == before
    assert EAGER_MODE_ENV["defer_and_fuse"] == {"TORCH_TPU_DEFER_AND_FUSE": "1"}
    assert EAGER_MODE_ENV["debug"] == {"TORCH_TPU_LAUNCH_BLOCKING": "1"}


def test_compile_events_include_the_tpu_cache(fake_tpu) -> None:
    events = TorchTpuBackend().compile_events()
    assert events["tpu_cache_misses"] == 3 and events["tpu_cache_requests"] == 10
    assert TorchTpuBackend().default_compile_backend() == "tpu"
    # MFU on TPU is quoted against the bf16 peak, whatever the matmul precision.
    assert TorchTpuBackend().compute_dtype(Candidate(matmul_precision="highest")) == "bfloat16"


def test_not_available_without_the_package() -> None:
    assert not TorchTpuBackend.is_available()
