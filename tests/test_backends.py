"""Backends: selection, the CPU roofline probe and its cache, compute dtypes."""

from __future__ import annotations

import json

import pytest
import torch

from tpu_tuner.backends import get_backend
from tpu_tuner.backends import roofline
from tpu_tuner.backends.cpu import CpuBackend
from tpu_tuner.candidate import Candidate
from tpu_tuner.errors import BackendError


def test_auto_detects_cpu_here() -> None:
    assert get_backend(None).kind == ("cuda" if torch.cuda.is_available() else "cpu")
    assert get_backend("cpu").device == torch.device("cpu")


def test_unknown_and_absent_devices_are_clear_errors() -> None:
    with pytest.raises(BackendError, match="unknown device 'gpu'"):
        get_backend("gpu")
    with pytest.raises(BackendError, match="'tpu' is not available here"):
        get_backend("tpu")


def test_roofline_probe_runs_once_per_machine(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TPU_TUNE_CACHE_DIR", str(tmp_path))
    calls = []
    real_measure = roofline.measure

    def counting_measure(device, sync):
        calls.append(device)
        return real_measure(device, sync)

    monkeypatch.setattr(roofline, "measure", counting_measure)
    first = CpuBackend().info()
    second = CpuBackend().info()
    assert len(calls) == 1
    assert "(cached)" in second.peak.source and "(cached)" not in first.peak.source
    assert first.peak.flops_per_s == second.peak.flops_per_s
    cache = json.loads((tmp_path / "roofline.json").read_text())
    assert list(cache) == [roofline.machine_key(torch.device("cpu"))]
    # Measured figures are physical: positive, and a copy moves at least 100 MB/s.
    assert first.peak.flops_per_s["float32"] > 1e9
    assert first.peak.flops_per_s["bfloat16"] > 1e9
    assert first.peak.memory_bytes_per_s > 1e8


def test_corrupt_roofline_cache_is_measured_again(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TPU_TUNE_CACHE_DIR", str(tmp_path))
    (tmp_path / "roofline.json").write_text("{not json")
    fake = roofline.RooflineProbe(1e11, 2e11, 1e10, 8, 8, 1, "now")
    monkeypatch.setattr(roofline, "measure", lambda device, sync: fake)
    probe, cached = roofline.cached_probe(torch.device("cpu"), lambda: None)
    assert probe == fake and not cached
    assert json.loads((tmp_path / "roofline.json").read_text())


@pytest.mark.parametrize(
    ("candidate", "dtype"),
    [
        (Candidate(), "float32"),
        (Candidate(matmul_precision="high"), "float32"),  # no TF32 on CPU
        (Candidate(matmul_precision="medium"), "bfloat16"),  # oneDNN bf16 on AMX
        (Candidate(autocast_dtype="bfloat16"), "bfloat16"),
    ],
)
def test_cpu_compute_dtype_picks_the_peak(candidate: Candidate, dtype: str) -> None:
    assert CpuBackend().compute_dtype(candidate) == dtype


def test_cpu_peak_memory_window_resets() -> None:
    backend = CpuBackend()
    backend.reset_peak_memory()
    before, method = backend.peak_memory_bytes()
    block = torch.ones(64 * 1024**2 // 4)  # touch 64 MiB
    after, _ = backend.peak_memory_bytes()
    del block
    assert "VmHWM" in method and after - before >= 60 * 1024**2
