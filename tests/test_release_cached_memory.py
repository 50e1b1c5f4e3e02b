"""Before a trial builds its step, the worker hands back what the device's allocator keeps cached
(the references' eager steps, an earlier trial of a kept worker): on TorchTPU a compiled
program's temporaries are the runtime's, and the sixth chip session saw compiled steps fail with
RuntimeProgramAllocationFailure after eager steps in the same process (docs/torchtpu.md). A
release that fails never fails the trial; on CPU nothing is called at all."""

from __future__ import annotations

from pathlib import Path

import torch

from tpu_tuner.devices.cpu import CpuBackend
from tpu_tuner.devices.torchtpu import TorchTpuBackend
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.runner.jobs import WorkerState, run_measure
from tpu_tuner.runner.requests import MeasureRequest

FIXTURES = Path(__file__).parent / "fixtures"


def test_each_trial_releases_the_cache_before_building_its_step(fast_settings, monkeypatch) -> None:
    order: list[str] = []
    monkeypatch.setattr(CpuBackend, "release_cached_memory", lambda self: order.append("release"))
    import tpu_tuner.runner.jobs as jobs

    real_prepare = jobs.prepare_step

    def prepare(*args, **kwargs):
        order.append("build")
        return real_prepare(*args, **kwargs)

    monkeypatch.setattr(jobs, "prepare_step", prepare)
    state = WorkerState(str(FIXTURES / "tiny_mlp_benchmark.py"), "cpu")
    request = MeasureRequest(
        candidate=Candidate().to_dict(),
        settings=fast_settings,
        model_flops_per_step=1e6,
        peak_flops_per_s={"float32": 1e12},
    )
    assert run_measure(state, request).step_median > 0
    assert order == ["release", "build"]


def test_torchtpu_empties_torchs_device_cache_and_a_failure_is_only_logged(monkeypatch) -> None:
    backend = object.__new__(TorchTpuBackend)  # no chip here: the method alone
    calls: list[str] = []
    monkeypatch.setattr(torch.accelerator, "empty_cache", lambda: calls.append("empty"))
    backend.release_cached_memory()
    assert calls == ["empty"]

    def refuses() -> None:
        raise RuntimeError("this allocator keeps no cache")

    monkeypatch.setattr(torch.accelerator, "empty_cache", refuses)
    backend.release_cached_memory()  # logged at debug level, nothing raised
