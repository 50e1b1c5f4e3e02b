"""Issue 12, item 7: batch size and sequence length on benchmark-style files, the batch size a
profile records, and the meta-device estimate that refuses huge steps before they run."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
import torch
from conftest import FIXTURES
from torch import nn

import tpu_tuner
from tpu_tuner.cli import main
from tpu_tuner.core.errors import UserInputError
from tpu_tuner.metrics.estimate import LiveMemory, estimate_step
from tpu_tuner.metrics.flops import count_step
from tpu_tuner.model.workloads.loader import load_workload
from tpu_tuner.profiling.profile import within_budget
from tpu_tuner.profiling.settings import ProfilerSettings


def test_batch_size_resizes_inputs_that_share_the_leading_size() -> None:
    workload = load_workload(FIXTURES / "batch2_benchmark.py")
    torch.manual_seed(0)
    x, scale, table = workload.batch(5, None)
    torch.manual_seed(0)
    x2, _, table2 = workload.batch(None, None)
    assert x.shape == (5, 16) and scale.shape == (5, 1)
    assert torch.equal(x[:2], x2) and torch.equal(x[2:4], x2) and torch.equal(x[4], x2[0])  # repeated
    assert torch.equal(table, table2)  # another leading size: left alone
    x1, scale1, table1 = workload.batch(1, None)
    assert x1.shape == (1, 16) and scale1.shape == (1, 1) and table1.shape == (3, 8)


def test_seq_len_is_refused_for_benchmark_files(capsys) -> None:
    with pytest.raises(UserInputError, match="--seq-len cannot be applied to a benchmark-style file"):
        tpu_tuner.profile(FIXTURES / "batch2_benchmark.py", device="cpu", seq_len=64)
    status = main(["profile", str(FIXTURES / "batch2_benchmark.py"), "--device", "cpu", "--seq-len", "64"])
    err = capsys.readouterr().err
    assert status == 2 and "batch2_benchmark.py" in err and len(err.strip().splitlines()) == 1


def test_profile_records_the_batch_that_ran(fast_settings) -> None:
    path = FIXTURES / "batch2_benchmark.py"
    default = tpu_tuner.profile(path, device="cpu", settings=fast_settings)
    assert default.workload["batch_size"] == 2  # get_inputs()'s leading size, not None or 1
    one = tpu_tuner.profile(path, device="cpu", batch_size=1, settings=fast_settings)
    assert one.workload["batch_size"] == 1
    # It really ran at batch 1: half the matmul FLOPs of batch 2, and a note says how.
    assert one.flops.counted_per_step * 2 == default.flops.counted_per_step == 2 * 2 * 16 * 8
    assert any("--batch-size 1" in note and "resized" in note for note in one.workload["notes"])


def test_native_files_record_what_make_batch_was_called_with(fast_settings) -> None:
    default = tpu_tuner.profile(FIXTURES / "tiny_gpt.py", device="cpu", settings=fast_settings)
    three = tpu_tuner.profile(FIXTURES / "tiny_gpt.py", device="cpu", batch_size=3, settings=fast_settings)
    assert default.workload["batch_size"] == 2  # the file's BATCH_SIZE
    assert three.workload["batch_size"] == 3
    assert three.flops.counted_per_step * 2 == default.flops.counted_per_step * 3


def test_huge_default_inputs_are_refused_in_seconds_with_the_estimate(capsys) -> None:
    start = time.monotonic()
    status = main(["profile", str(FIXTURES / "huge_inputs.py"), "--device", "cpu", "--out", "/nonexistent/never"])
    elapsed = time.monotonic() - start
    err = capsys.readouterr().err.strip()
    assert status == 2 and elapsed < 20
    assert "huge_inputs.py: one step needs ~256 GiB" in err and "available; pass --batch-size" in err


def test_a_step_over_the_time_budget_is_refused(fast_settings) -> None:
    settings = dataclasses.replace(fast_settings, max_step_seconds=1e-12)
    with pytest.raises(UserInputError, match=r"one step needs at least .* budget \(\[budget\] max_step_seconds\)"):
        tpu_tuner.profile(FIXTURES / "tiny_mlp_benchmark.py", device="cpu", settings=settings)


def test_meta_estimate_matches_the_real_step() -> None:
    """FLOPs from the meta pass equal the counted FLOPs of the real step (training, tiny GPT)."""
    workload = load_workload(FIXTURES / "tiny_gpt.py")
    estimate = estimate_step(workload, 3, 16)
    assert estimate is not None and estimate.batch_size == 3
    model = workload.build_model()
    inputs, target = workload.batch(3, 16)
    real = count_step(lambda: workload.loss_fn(model(inputs), target).backward())
    assert estimate.flops == real.total
    params = sum(p.numel() * 4 for p in model.parameters())
    assert estimate.optimizer_bytes == 2 * params  # AdamW's two moments
    assert estimate.memory_bytes > 2 * params + estimate.input_bytes


def test_live_memory_tracks_the_peak_not_the_sum() -> None:
    """Inference through 8 layers keeps two activations alive at once, not eight."""
    with torch.device("meta"):
        model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(8)])
        x = torch.randn(512, 256)
        live = LiveMemory()
        with live, torch.no_grad():
            model(x)
    assert live.peak == 2 * 512 * 256 * 4


def test_meta_pass_failure_falls_back_to_no_estimate(tmp_path: Path, fast_settings) -> None:
    path = tmp_path / "needs_data.py"
    path.write_text(
        "import torch\nfrom torch import nn\n\n"
        "class Model(nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x * float(x.abs().max())  # reads a value: impossible on the meta device\n\n"
        "def get_inputs():\n    return [torch.randn(4, 4)]\n"
    )
    assert estimate_step(load_workload(path), None, None) is None
    result = tpu_tuner.profile(path, device="cpu", settings=fast_settings)
    assert result.estimate is None and result.timing.count >= 1


def test_slow_steps_cap_warmup_timing_and_profiling_by_the_budget() -> None:
    settings = ProfilerSettings()
    warnings: list[str] = []
    capped = within_budget(settings, step_seconds=10.0, deadline=time.monotonic() + 100, warnings=warnings)
    budget_steps = capped.warmup_max_steps + capped.timing_max_steps + capped.profiled_steps
    assert budget_steps * 10.0 <= 100 and capped.timing_min_steps <= capped.timing_max_steps
    assert len(warnings) == 1 and warnings[0].startswith("time budget:")
    fast = within_budget(settings, step_seconds=1e-4, deadline=time.monotonic() + 100, warnings=warnings)
    assert fast == settings  # fast steps: nothing capped
