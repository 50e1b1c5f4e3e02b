"""Backends: selection, the CPU roofline probe and its cache, compute dtypes."""

from __future__ import annotations

import json
import mmap

import pytest
import torch
from conftest import use_probe

from tpu_tuner.core.errors import BackendError
from tpu_tuner.devices import get_backend, roofline
from tpu_tuner.devices.cpu import CpuBackend
from tpu_tuner.knobs.candidate import Candidate


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
    # The probe's numerics and dispatch figures (this host's; only their physical ranges), from the cache.
    probe, cached = roofline.cached_probe(torch.device("cpu"), lambda: None)
    assert cached and len(calls) == 1
    assert 1e-9 < probe.medium_relative_error < 1e-1
    assert 1e-8 < probe.dispatch_seconds_per_op < 1e-3
    assert set(probe.spread()) == {
        "float32_flops_per_s",
        "bfloat16_flops_per_s",
        "copy_bytes_per_s",
        "dispatch_seconds_per_op",
    }


def test_corrupt_roofline_cache_is_measured_again(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TPU_TUNE_CACHE_DIR", str(tmp_path))
    (tmp_path / "roofline.json").write_text("{not json")
    fake = roofline.RooflineProbe(1e11, 2e11, 1e10, 8, 8, 1, "now")
    monkeypatch.setattr(roofline, "measure", lambda device, sync: fake)
    probe, cached = roofline.cached_probe(torch.device("cpu"), lambda: None)
    assert probe == fake and not cached
    assert json.loads((tmp_path / "roofline.json").read_text())


@pytest.mark.parametrize(
    ("candidate", "medium_error", "dtype"),
    [
        (Candidate(), 2.5e-3, "float32"),
        (Candidate(matmul_precision="high"), 2.5e-3, "float32"),  # no TF32 on CPU
        (Candidate(matmul_precision="medium"), 2.5e-3, "bfloat16"),  # the probe saw bf16 numerics
        (Candidate(matmul_precision="medium"), 4e-7, "float32"),  # the probe saw fp32 numerics
        (Candidate(autocast="bfloat16"), 4e-7, "bfloat16"),
    ],
)
def test_cpu_compute_dtype_follows_the_probe(
    candidate: Candidate, medium_error: float, dtype: str, tmp_path, monkeypatch
) -> None:
    use_probe(monkeypatch, tmp_path, medium_relative_error=medium_error)
    assert candidate.compute_dtype(CpuBackend()) == dtype


def _fake_rounds(fp32: list[float], bf16: list[float], dispatch: list[float]) -> list[dict[str, float]]:
    return [
        {"float32_flops_per_s": a, "bfloat16_flops_per_s": b, "copy_bytes_per_s": 1e10, "dispatch_seconds_per_op": d}
        for a, b, d in zip(fp32, bf16, dispatch)
    ]


def test_probe_keeps_the_best_round_and_its_spread() -> None:
    # Round 2 ran under load (fp32 234 instead of 319): the best round is the peak.
    probe = roofline.probe_from_rounds(
        _fake_rounds([300e9, 234e9, 319e9], [60e9, 50e9, 58e9], [2e-6, 5e-6, 1e-6]),
        repeats=3,
        medium_error=1e-7,
        now=1000.0,
    )
    assert probe.float32_flops_per_s == 319e9 and probe.bfloat16_flops_per_s == 60e9
    assert probe.dispatch_seconds_per_op == 1e-6  # a cost: the lowest round is the floor
    spread = probe.spread()["float32_flops_per_s"]
    assert (spread.min, spread.median, spread.max) == (234e9, 300e9, 319e9)
    assert spread.cv == pytest.approx(0.155, abs=0.005)
    assert "best of 3 rounds x 3" in probe.describe() and "234-319 GFLOP/s" in probe.describe()
    assert probe.medium_changes_numerics is False and probe.bf16_speed_ratio == pytest.approx(60 / 319)


def test_best_of_uses_the_injected_clock() -> None:
    ticks = iter([0.0, 5.0, 10.0, 12.0, 20.0, 23.0])  # durations 5, 2, 3
    assert roofline._best_of(lambda: None, lambda: None, 3, timer=lambda: next(ticks)) == 2.0


def _probe(fp32: float, when: float) -> roofline.RooflineProbe:
    return roofline.probe_from_rounds(_fake_rounds([fp32], [fp32 / 4], [1e-6]), 1, 1e-7, now=when)


def test_probe_cache_expires_and_is_keyed_by_cpu_model_and_cores(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TPU_TUNE_CACHE_DIR", str(tmp_path))
    clock = [1_000_000.0]
    measured = []

    def fake_measure(device, sync):
        measured.append(clock[0])
        return _probe(300e9, clock[0])

    def probe() -> tuple[roofline.RooflineProbe, bool]:
        return roofline.cached_probe(torch.device("cpu"), lambda: None, measure_fn=fake_measure, now=lambda: clock[0])

    assert probe()[1] is False
    clock[0] += 6 * 86400
    assert probe()[1] is True and len(measured) == 1  # six days old: still valid
    clock[0] += 2 * 86400
    assert probe()[1] is False and len(measured) == 2  # eight days old: measured again
    key = roofline.machine_key(torch.device("cpu"))
    assert roofline.cpu_model_name() in key and f"{roofline.usable_cores()} usable" in key
    assert f"v{roofline.PROBE_VERSION}|" in key  # entries of an older probe format are ignored
    monkeypatch.setattr(roofline, "cpu_model_name", lambda: "Another CPU")
    assert probe()[1] is False and len(measured) == 3  # another processor: its own entry
    assert len(json.loads((tmp_path / "roofline.json").read_text())) == 2


def test_forced_reprobe_keeps_the_best_of_old_and_new(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TPU_TUNE_CACHE_DIR", str(tmp_path))
    figures = iter([319e9, 234e9])  # quiet first, then under load

    def fake_measure(device, sync):
        return _probe(next(figures), 10.0)

    roofline.cached_probe(torch.device("cpu"), lambda: None, measure_fn=fake_measure, now=lambda: 10.0)
    again, cached = roofline.cached_probe(
        torch.device("cpu"), lambda: None, force=True, measure_fn=fake_measure, now=lambda: 10.0
    )
    assert not cached and again.float32_flops_per_s == 319e9
    assert again.rounds["float32_flops_per_s"] == [319e9, 234e9]


def test_a_probe_taken_under_load_is_measured_again_within_the_hour(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TPU_TUNE_CACHE_DIR", str(tmp_path))
    clock = [1000.0]
    cores = roofline.usable_cores()
    probes = iter([(234e9, 2.0 * cores), (319e9, 0.1), (300e9, 0.1)])  # busy first, then quiet

    def fake_measure(device, sync):
        fp32, load = next(probes)
        return roofline.probe_from_rounds(
            _fake_rounds([fp32], [fp32 / 4], [1e-6]), 1, 1e-7, now=clock[0], load_average=load
        )

    def probe() -> tuple[roofline.RooflineProbe, bool]:
        return roofline.cached_probe(torch.device("cpu"), lambda: None, measure_fn=fake_measure, now=lambda: clock[0])

    busy, _ = probe()
    assert busy.under_load and "taken under load" in busy.describe()
    clock[0] += 1800
    assert probe() == (busy, True)  # within the hour: kept
    clock[0] += 1900
    quiet, cached = probe()  # over an hour: measured again, the best of both kept
    assert not cached and not quiet.under_load and quiet.float32_flops_per_s == 319e9
    clock[0] += 2 * 86400
    assert probe() == (quiet, True)  # a quiet probe lasts the week


def test_old_format_cache_entries_are_measured_again(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TPU_TUNE_CACHE_DIR", str(tmp_path))
    old = {
        "float32_flops_per_s": 1e11,
        "bfloat16_flops_per_s": 2e11,
        "copy_bytes_per_s": 1e10,
        "matmul_size": 8,
        "copy_bytes": 8,
        "repeats": 1,
        "measured_at": "then",
        "version": 1,
    }
    (tmp_path / "roofline.json").write_text(json.dumps({roofline.machine_key(torch.device("cpu")): old}))
    fresh = _probe(300e9, 10.0)
    probe, cached = roofline.cached_probe(
        torch.device("cpu"), lambda: None, measure_fn=lambda d, s: fresh, now=lambda: 10.0
    )
    assert probe == fresh and not cached


def test_cpu_peak_memory_window_resets() -> None:
    backend = CpuBackend()
    backend.reset_peak_memory()
    before, method = backend.peak_memory_bytes()
    # Touch 64 MiB of fresh pages: an anonymous mapping, never memory an allocator kept resident
    # from earlier tests (the probe's freed buffers made a torch.ones block reuse resident pages).
    block = mmap.mmap(-1, 64 * 1024**2)
    block.write(b"\x01" * (64 * 1024**2))
    after, _ = backend.peak_memory_bytes()
    block.close()
    assert "VmHWM" in method and after - before >= 60 * 1024**2


@pytest.mark.parametrize(
    ("candidate", "dtype"),
    [
        (Candidate(), "float32"),
        (Candidate(matmul_precision="high"), "tf32"),  # TF32 tensor cores
        (Candidate(matmul_precision="medium", autocast="float16"), "float16"),  # autocast decides
        (Candidate(autocast="bfloat16"), "bfloat16"),
    ],
)
def test_cuda_compute_dtype_combines_the_knobs_with_the_device(candidate: Candidate, dtype: str) -> None:
    # The backend only answers for a precision or an autocast dtype; no GPU is needed to ask.
    from tpu_tuner.devices.cuda import CudaBackend

    assert candidate.compute_dtype(CudaBackend()) == dtype


def test_a_device_s_baseline_runs_its_own_matmul_precision() -> None:
    assert Candidate.baseline("cpu") == Candidate() == Candidate.baseline("cuda")
    assert Candidate.baseline("tpu")["matmul_precision"] == "medium"  # TorchTPU's own default
