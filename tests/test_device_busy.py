"""The device's busy time from profiler events, and a verdict that never states a dispatch share
above 100% of the step (issue 54, item 7): on a TPU v5e chip 414 ops x 197 µs of per-op
dispatch cost read "81.6 ms (239%)" of a 34 ms step."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from tpu_tuner.core.definitions import load_definition
from tpu_tuner.execution.operators import DeviceBusy, device_busy
from tpu_tuner.profiling.verdict import decide
from tpu_tuner.tuning.agents import CompileAgent

PEAK, BANDWIDTH = 1e12, 1e11
STEP, OPS, PER_OP = 0.0341, 414, 197e-6  # the chip: 81.6 ms of "dispatch" in a 34.1 ms step (239%)


def _event(start_us: float, end_us: float, kind=DeviceType.PrivateUse1, activity: str = "kernel") -> FunctionEvent:
    return FunctionEvent(
        id=0, name="op", thread=0, start_us=start_us, end_us=end_us, device_type=kind, activity_type=activity
    )


def test_busy_time_is_the_union_of_device_intervals_per_step() -> None:
    events = [
        _event(0, 100),
        _event(50, 150),  # overlaps the first: 0-150 counts once
        _event(200, 300),
        _event(210, 220),  # nested inside 200-300
        _event(0, 1000, kind=DeviceType.CPU, activity="cpu_op"),  # host work is never device time
        _event(0, 300, activity="gpu_user_annotation"),  # a range mirrored on the device timeline
        _event(400, 400),  # zero length
    ]
    busy = device_busy(events, steps=2)
    assert busy is not None and busy.events == 4
    assert busy.seconds_per_step == pytest.approx(250e-6 / 2)
    assert "PrivateUse1" in busy.method and "overlaps counted once" in busy.method
    cuda = device_busy([_event(0, 10, kind=DeviceType.CUDA), _event(5, 30, kind=DeviceType.CUDA)], steps=1)
    assert cuda is not None and cuda.seconds_per_step == pytest.approx(30e-6)


def test_a_host_only_trace_has_no_busy_time() -> None:
    assert device_busy([_event(0, 100, kind=DeviceType.CPU, activity="cpu_op")], steps=3) is None
    assert device_busy([], steps=3) is None


def _shares_stated(summary: str) -> list[float]:
    return [float(share) for share in re.findall(r"(\d+(?:\.\d+)?)%", summary)]


def _decide(flops: float = 1e9, bytes_moved: float = 1e8, busy: float | None = None, per_op: float = PER_OP):
    return decide(
        flops,
        bytes_moved,
        STEP,
        PEAK,
        "bfloat16",
        BANDWIDTH,
        ops_per_step=OPS,
        explained_share_min=0.5,
        dispatch_seconds_per_op=per_op,
        top_operators=[("aten::mm", 0.6)],
        device_busy_seconds=busy,
    )


def test_a_dispatch_product_above_the_step_is_left_out_with_why() -> None:
    verdict = _decide()  # no device events (a CPU-like trace): today's logic, capped
    assert verdict.dispatch_share is None and verdict.dispatch_seconds is None
    assert verdict.bound == "below-roofline"  # never overhead-bound on a 239% product alone
    assert "81.6 ms, 2.4x the whole step" in verdict.summary and "cannot apply as measured" in verdict.summary
    assert "sync round trip" in verdict.summary and "overlaps device work" in verdict.summary
    assert verdict.dispatch_note is not None and verdict.dispatch_seconds_per_op == PER_OP
    assert max(_shares_stated(verdict.summary)) <= 100  # no share above the whole step
    # A product that fits in the step is still the overhead term, as before.
    fits = _decide(per_op=60e-6)  # 414 x 60 µs = 24.8 ms of 34 ms
    assert fits.bound == "overhead-bound" and fits.dispatch_share == pytest.approx(OPS * 60e-6 / STEP)
    assert fits.dispatch_note is None


def test_a_device_busy_95_percent_is_device_bound() -> None:
    busy = 0.95 * STEP
    compute = _decide(flops=0.8 * STEP * PEAK, busy=busy)  # 80% of the step at peak
    assert compute.bound == "compute-bound" and compute.device_busy_share == pytest.approx(0.95)
    assert compute.dispatch_share == pytest.approx(0.05) and "idle 5%" in compute.summary
    memory = _decide(bytes_moved=0.7 * STEP * BANDWIDTH, busy=busy)
    assert memory.bound == "memory-bound"
    slow = _decide(busy=busy)  # busy, yet neither FLOPs nor bytes explain it
    assert slow.bound == "below-roofline" and "the device is busy most of the step" in slow.summary
    for verdict in (compute, memory, slow):
        assert "2.4x the whole step" in verdict.summary  # the product is named as unusable, not used
        assert verdict.bound != "overhead-bound" and max(_shares_stated(verdict.summary)) <= 100


def test_a_device_busy_20_percent_is_overhead_bound_by_its_idle_share() -> None:
    verdict = _decide(busy=0.2 * STEP)
    assert verdict.bound == "overhead-bound"
    assert verdict.dispatch_share == pytest.approx(0.8) and verdict.dispatch_seconds == pytest.approx(0.8 * STEP)
    assert "device busy 6.82 ms per step (20%; idle 80%" in verdict.summary
    assert "81.6 ms" in verdict.summary and "left out" in verdict.summary  # the product, explained away
    assert max(_shares_stated(verdict.summary)) <= 100
    # The compile agent reads an overhead-bound verdict without failing.
    agent = CompileAgent(load_definition("agents", "compile"), "tpu")
    profile = SimpleNamespace(
        verdict=verdict,
        warmup=SimpleNamespace(first_call_seconds=1.0),
        timing=SimpleNamespace(median=STEP),
        operators=[],
        workload=SimpleNamespace(training=False, step="inference (forward)"),
    )
    assert any("overhead-bound" in finding for finding in agent.diagnose(profile))


def test_a_busy_time_above_the_step_is_capped() -> None:
    verdict = _decide(flops=0.8 * STEP * PEAK, busy=1.3 * STEP)
    assert verdict.device_busy_share == 1.0 and verdict.dispatch_share == 0.0
    assert "capped at 100%" in verdict.summary and verdict.bound == "compute-bound"


def test_the_profile_carries_the_busy_time_and_reads_old_files(tmp_path, monkeypatch, fast_settings) -> None:
    import sys

    from conftest import FIXTURES, use_probe

    import tpu_tuner
    from tpu_tuner.outputs.profile_report import render_markdown, render_terminal
    from tpu_tuner.profiling.profile import Profile

    use_probe(monkeypatch, tmp_path, dispatch_seconds_per_op=3e-6)
    cpu = tpu_tuner.profile(FIXTURES / "tiny_mlp_benchmark.py", device="cpu", settings=fast_settings)
    assert cpu.device_busy_seconds is None and cpu.verdict.device_busy_seconds is None
    assert cpu.device_busy_method is not None and cpu.device_busy_method.startswith("not measured")
    assert "device busy  not measured" in render_terminal(cpu)

    # A trace with device events (faked: CI has no accelerator) feeds the verdict and the report.
    fake = DeviceBusy(seconds_per_step=1e-9, events=7, method="union of 7 PrivateUse1 device-event intervals")
    monkeypatch.setattr(sys.modules["tpu_tuner.profiling.profile"], "device_busy", lambda events, steps: fake)
    idle = tpu_tuner.profile(FIXTURES / "tiny_mlp_benchmark.py", device="cpu", settings=fast_settings)
    assert idle.device_busy_seconds == 1e-9 and idle.verdict.device_busy_seconds == 1e-9
    assert idle.verdict.bound == "overhead-bound" and idle.verdict.dispatch_share == pytest.approx(1.0, abs=1e-3)
    assert "union of 7 PrivateUse1" in render_markdown(idle)
    assert Profile.from_json(idle.to_json()).device_busy_seconds == 1e-9

    # A profile.json written before these fields existed still loads, and shows no busy row.
    data = json.loads(cpu.to_json())
    for key in ("device_busy_seconds", "device_busy_method"):
        del data[key]
    for key in ("device_busy_seconds", "device_busy_share", "dispatch_note"):
        del data["verdict"][key]
    old = Profile.from_json(json.dumps(data))
    assert old.device_busy_seconds is None and old.device_busy_method is None
    assert old.verdict.device_busy_share is None
    assert "device busy" not in render_terminal(old) and "Device busy" not in render_markdown(old)
