"""The TorchTPU adapter's own logic against a stand-in ``torch.tpu`` (the default environment has
no torch-tpu). The stand-in has the shapes of the released 0.2.0's names (an EagerMode enum, the
``set_eager_mode`` context manager, ``_get_cache_stats`` returning counters as attributes);
tests/test_torchtpu_contract.py checks those names against the real package."""

from __future__ import annotations

import contextlib
import enum
import importlib.util
import sys
import types

import pytest
import torch

from tpu_tuner.backends import get_backend
from tpu_tuner.backends.torchtpu import EAGER_MODE_ENV, TorchTpuBackend
from tpu_tuner.candidate import Candidate
from tpu_tuner.errors import BackendError


class EagerMode(enum.Enum):
    DEFER_AND_FUSE = 0
    DEFER_NEVER = 1
    DEFER_NEVER_AND_LAUNCH_BLOCKING = 2


@pytest.fixture
def fake_tpu(monkeypatch):
    state = types.SimpleNamespace(mode=EagerMode.DEFER_NEVER)

    @contextlib.contextmanager
    def set_eager_mode(mode):
        previous, state.mode = state.mode, mode
        try:
            yield
        finally:
            state.mode = previous

    tpu = types.SimpleNamespace(
        EagerMode=EagerMode,
        set_eager_mode=set_eager_mode,
        get_device_name=lambda: "TPU v5p",
        get_device_properties=lambda: types.SimpleNamespace(total_memory=95 * 1024**3),
        _get_cache_stats=lambda: types.SimpleNamespace(num_compilations=3, num_cache_reqs=10, num_cache_hits=7),
    )
    hardware = types.ModuleType("torch_tpu._internal.utils.hardware")
    hardware.get_bf16_flops_per_device = lambda: None  # unknown to the runtime: our table answers
    for name in ("torch_tpu", "torch_tpu._internal", "torch_tpu._internal.utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "torch_tpu._internal.utils.hardware", hardware)
    monkeypatch.setattr(torch, "tpu", tpu, raising=False)
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: 4)
    return state


def test_peak_comes_from_the_spec_table_where_the_runtime_has_none(fake_tpu) -> None:
    info = TorchTpuBackend().info()
    assert (info.kind, info.name, info.count) == ("tpu", "TPU v5p", 4)
    assert info.peak.flops_per_s["bfloat16"] == 459e12
    assert info.peak.memory_bytes_per_s == 2765e9
    assert "Google TPU spec table (v5p)" in info.peak.source
    assert info.memory_bytes == 95 * 1024**3


def test_an_unknown_generation_is_an_error_not_a_guess(fake_tpu) -> None:
    torch.tpu.get_device_name = lambda: "TPU"  # what 0.2.0 answers for a chip it does not know
    with pytest.raises(BackendError, match="unknown TPU generation 'TPU'"):
        TorchTpuBackend().info()


def test_eager_mode_and_precision_are_applied_and_restored(fake_tpu) -> None:
    backend = TorchTpuBackend()
    before = torch.get_float32_matmul_precision()
    with backend.applied(Candidate(execution="eager:defer_and_fuse", matmul_precision="medium")):
        assert fake_tpu.mode is EagerMode.DEFER_AND_FUSE
        assert torch.get_float32_matmul_precision() == "medium"
    assert fake_tpu.mode is EagerMode.DEFER_NEVER
    assert torch.get_float32_matmul_precision() == before
    assert EAGER_MODE_ENV["defer_and_fuse"] == {"TORCH_TPU_DEFER_AND_FUSE": "1"}
    assert EAGER_MODE_ENV["debug"] == {"TORCH_TPU_LAUNCH_BLOCKING": "1"}


def test_compile_events_read_the_cache_counters(fake_tpu) -> None:
    events = TorchTpuBackend().compile_events()
    assert (events["tpu_compilations"], events["tpu_cache_requests"], events["tpu_cache_hits"]) == (3, 10, 7)
    assert TorchTpuBackend().default_compile_backend() == "tpu"
    # MFU on TPU is quoted against the bf16 peak, whatever the matmul precision.
    assert TorchTpuBackend().compute_dtype(Candidate(matmul_precision="highest")) == "bfloat16"


def test_a_mode_on_the_tpu_compile_backend_is_refused() -> None:
    # torch passes mode on to the backend, and torch-tpu 0.2.0 raises TypeError on it.
    with pytest.raises(ValueError, match="TorchTPU's compile backend takes no mode"):
        Candidate(execution="tpu:max-autotune")
    assert Candidate(execution="tpu")["execution"] == "tpu"


@pytest.mark.skipif(importlib.util.find_spec("torch_tpu") is not None, reason="torch-tpu is installed here")
def test_not_available_without_the_package_and_says_why() -> None:
    assert TorchTpuBackend.unavailable_reason() == "torch-tpu is not installed (pip install -e '.[tpu]')"
    with pytest.raises(BackendError, match="'tpu' is not available here: torch-tpu is not installed"):
        get_backend("tpu")
