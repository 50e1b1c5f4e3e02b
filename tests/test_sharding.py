"""Sharding layouts run for real on 2 gloo ranks started by PyTorch's launcher: each layout's
loss and gradients match the single-device fp32 reference; a layout the model cannot run, and a
rank that crashes, hangs or raises, fail with the rank and the reason and leave no process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import processes_running

from tpu_tuner.parallel.apply import LayoutError, parse_layout
from tpu_tuner.runner.launch import run_ranks
from tpu_tuner.runner.sharded_check import check_layout

FIXTURES = Path(__file__).parent / "fixtures"
TOLERANCE = 1e-5  # fp32 on both sides: only the order of reductions differs


@pytest.mark.parametrize("layout", ["2x1x1", "1x2x1", "1x1x2"])
def test_each_layout_matches_the_single_device_reference(layout: str) -> None:
    result = check_layout(FIXTURES / "tiny_llama.py", layout, nproc=2, timeout_s=120)
    assert result.ok, result.failure
    report = result.reports[0]
    assert report["loss_error"] < TOLERANCE and report["gradient_error"] < TOLERANCE
    assert report["local_batch"] == (4 if layout == "1x1x2" else 2)  # tensor ranks share the batch


@pytest.mark.slow  # two ranks started for a layout that fails: an end-to-end check
def test_a_layout_the_model_cannot_run_fails_with_the_reason() -> None:
    # examples/gpt.py projects q, k and v with one fused Linear: a column-wise split of it hands
    # each rank part of q and part of k, which its forward cannot unpack.
    result = check_layout(FIXTURES / "tiny_gpt.py", "1x1x2", nproc=2, timeout_s=120)
    assert not result.ok and result.kind == "error"
    assert result.failure.startswith("rank ") and "ValueError" in result.failure
    refused = check_layout(FIXTURES / "tiny_llama.py", "2x1x1", nproc=2, batch_size=3, timeout_s=120)
    assert "does not divide over data x fsdp = 2" in refused.failure


def test_layout_strings_are_checked() -> None:
    assert parse_layout("2x1x4").devices == 8
    for bad in ("2x1", "0x1x1", "axbxc"):
        with pytest.raises(LayoutError):
            parse_layout(bad)


@pytest.mark.parametrize(
    "mode, kind, says",
    [
        ("segfault", "crash", "rank 1 died from SIGSEGV"),
        ("raise", "error", "RuntimeError: rank 1 gave up"),
        ("hang", "timeout", "no rank finished within 8 s"),
    ],
)
@pytest.mark.slow  # a whole run end to end: .ci/run's full pass
@pytest.mark.timed  # 2 ranks with an 8 s deadline: a slow start reads as the hang
def test_a_rank_that_fails_fails_the_run_and_leaves_no_process(monkeypatch, mode: str, kind: str, says: str) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")]))
    result = run_ranks(2, "misbehaving_rank", [mode], timeout_s=8)
    assert not result.ok and result.kind == kind and says in result.failure
    assert processes_running("misbehaving_rank") == []
    healthy = run_ranks(2, "misbehaving_rank", ["none"], timeout_s=60)
    assert healthy.ok and sorted(healthy.reports) == [0, 1]


# Slow: two gloo ranks end to end (.ci/run's full pass). Not timed: it counts steps and compares the
# ranks' state bytes, which no load changes (the runner's deadline is 120 s).
@pytest.mark.slow
def test_fsdp_holds_a_share_of_the_model_state_and_every_step_is_timed_on_the_slowest_rank() -> None:
    from tpu_tuner.runner.ranked_runner import RankedTrialRunner
    from tpu_tuner.runner.requests import ShardedStepRequest

    with RankedTrialRunner(str(FIXTURES / "tiny_llama.py"), "cpu", 2, timeout_s=120) as runner:
        ddp = runner.run(ShardedStepRequest(layout="2x1x1", steps=3))
        fsdp = runner.run(ShardedStepRequest(layout="1x2x1", steps=3))
    assert ddp.ok and fsdp.ok, (ddp.failure, fsdp.failure)
    for result in (ddp, fsdp):
        timing = result.value
        assert len(timing.step_seconds) == 3 and min(timing.step_seconds) > 0
        assert len(timing.peak_bytes) == 2 and min(timing.peak_bytes) > 0
    # Parameters and AdamW's two moments: DDP holds all of them on each rank, FSDP half.
    for ddp_bytes, fsdp_bytes in zip(ddp.value.state_bytes, fsdp.value.state_bytes):
        assert fsdp_bytes < 0.6 * ddp_bytes


def test_a_config_s_layout_applies_only_on_a_process_group_of_its_size(tmp_path) -> None:
    import torch.distributed as dist
    from torch import nn

    from tpu_tuner.knobs.candidate import Candidate
    from tpu_tuner.knobs.tuned_config import TunedConfig, apply_sharding
    from tpu_tuner.parallel.apply import LayoutError

    path = tmp_path / "sharding_config.toml"
    TunedConfig(Candidate(), "cpu", sharding={"mesh": {"data": 1, "fsdp": 2, "tensor": 1}}).save(path)
    model = nn.Linear(4, 4)
    with pytest.raises(LayoutError, match="layout 1x2x1 runs on 2 processes, one per device: start them"):
        apply_sharding(model, path)  # one process: refused with what to start, never silently whole
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        with pytest.raises(LayoutError, match="layout 1x2x1 needs 2 ranks, not 1"):
            apply_sharding(model, path)
    finally:
        dist.destroy_process_group()


def test_apply_prints_how_a_config_with_a_mesh_is_sharded(tmp_path) -> None:
    from tpu_tuner.knobs.candidate import Candidate
    from tpu_tuner.knobs.tuned_config import TunedConfig

    config = TunedConfig(Candidate(), "cpu", sharding={"mesh": {"data": 1, "fsdp": 2, "tensor": 1}})
    assert config.candidate["layout"] == "1x2x1"  # the mesh alone is the layout setting
    printed = "\n".join(config.instructions(tmp_path / "c.toml"))
    assert (
        "sharding data 1 x fsdp 2 x tensor 1: run one process per device (2, e.g. torchrun --nproc-per-node 2)"
        in printed
    )
    assert "apply_layout(model, Layout(data=1, fsdp=2, tensor=1), device_type='cpu')" in printed


def test_one_layout_spelling_parses_and_formats_alike() -> None:
    from tpu_tuner.model.meshes.layouts import Layout, parse_layout

    for text in ("1x64x4", "1x32x4x2", "2x1x1"):
        layout = parse_layout(text)
        assert layout.short() == text and Layout.from_mesh(layout.mesh_shape()) == layout
    assert parse_layout("1x32x4x2").without_context().short() == "1x64x4"
    assert parse_layout("1x32x4x2").short(with_context=False) == "1x32x4"
    for bad, context in (("1x4", True), ("1x2x1x1x1", True), ("1x2x1x2", False), ("0x1x1", False), ("axbxc", True)):
        with pytest.raises(ValueError, match="DATAxFSDPxTENSOR|at least 1"):
            parse_layout(bad, context=context)
