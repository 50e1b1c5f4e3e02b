"""Memory before measurement: a step's peak estimated on fake tensors (execution/memory_estimate.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tpu_tuner.core.failures import FailureKind, classify  # noqa: E402
from tpu_tuner.devices import get_backend  # noqa: E402
from tpu_tuner.execution.memory_estimate import (  # noqa: E402
    MemoryEstimate,
    estimate_or_refuse,
    estimate_step_memory,
    over_limit,
)
from tpu_tuner.execution.step import prepare_step  # noqa: E402
from tpu_tuner.knobs.candidate import Candidate  # noqa: E402
from tpu_tuner.model.loader import load_workload  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GPT = ROOT / "examples" / "gpt.py"


def allocation_peak(step_of: object) -> int:
    """The peak of the c10 CPU allocator's live bytes over building the step and two steps, read
    from the profiler's allocation events: an instrument independent of the estimate's."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step = step_of()  # type: ignore[operator]
        step.run_eager()
        step.run_eager()
    sizes, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation:
            sizes.append((event.start_time_ns, event.extra_fields.alloc_size))
    live = peak = 0
    for _, size in sorted(sizes):
        live += size
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("batch_size", [2, 8])
def test_estimate_is_within_ten_percent_of_the_allocated_peak(batch_size: int) -> None:
    workload, backend, candidate = load_workload(str(GPT)), get_backend("cpu"), Candidate.baseline("cpu")
    estimate = estimate_step_memory(workload, backend, candidate, batch_size, 64)
    assert estimate.reason is None and estimate.step_bytes is not None
    measured = allocation_peak(lambda: prepare_step(workload, backend, candidate, batch_size, 64))
    assert abs(estimate.step_bytes / measured - 1) < 0.10, (estimate.step_bytes, measured)
    # The floor (no activations) is below the peak and holds at least the weights.
    params = sum(p.numel() * p.element_size() for p in workload.build_model().parameters())
    assert estimate.floor_bytes is not None and params <= estimate.floor_bytes < estimate.step_bytes


def test_over_limit_names_the_estimate_and_its_source() -> None:
    estimate = MemoryEstimate(step_bytes=3 * 2**30, in_use_bytes=2**30, floor_bytes=2**29)
    reason = over_limit(estimate, 2 * 2**30, "--trial-memory-gb")
    assert reason is not None and reason.startswith("would not fit: estimated peak memory 4.00 GiB")
    assert "> 2.00 GiB (--trial-memory-gb)" in reason
    assert classify(message=f"WouldNotFit: {reason}") is FailureKind.WOULD_NOT_FIT
    # A compiled step is judged by what no compiler frees: 1.5 GiB fits 2 GiB.
    assert over_limit(estimate, 2 * 2**30, "x", compiled=True) is None
    assert over_limit(MemoryEstimate(None, reason="no"), 1, "x") is None


# Refused by the estimate, then forced under an address-space limit the estimate says is too small.
FORCED = textwrap.dedent(
    """
    import resource, sys
    from tpu_tuner.devices import get_backend
    from tpu_tuner.execution.memory_estimate import WouldNotFit, estimate_or_refuse
    from tpu_tuner.execution.step import prepare_step
    from tpu_tuner.knobs.candidate import Candidate
    from tpu_tuner.model.loader import load_workload

    workload, backend, candidate = load_workload(sys.argv[1]), get_backend("cpu"), Candidate.baseline("cpu")
    probe = estimate_or_refuse(workload, backend, candidate, 64, 256, None, "")
    room = int(0.7 * probe.step_bytes)  # 70% of what the step needs on top of what the process holds
    try:
        estimate_or_refuse(workload, backend, candidate, 64, 256, probe.in_use_bytes + room, "the test")
    except WouldNotFit as refused:
        print("refused:", refused)
    else:
        sys.exit("not refused")
    def vm_size():
        for line in open("/proc/self/status"):
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    limit = vm_size() + room
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        step = prepare_step(workload, backend, candidate, 64, 256)
        step.run_eager()
        step.run_eager()
    except (MemoryError, RuntimeError) as exc:
        print("forced: out of memory:", str(exc).splitlines()[0])
        sys.exit(0)
    sys.exit("forced: it fit")
    """
)


def test_a_setting_the_estimate_refuses_runs_out_of_memory_when_forced(tmp_path: Path) -> None:
    script = tmp_path / "forced.py"
    script.write_text(FORCED)
    done = subprocess.run(
        [sys.executable, str(script), str(GPT)],
        capture_output=True,
        text=True,
        timeout=600,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "refused: would not fit" in done.stdout
    assert "forced: out of memory" in done.stdout


FAKE_HOSTILE = textwrap.dedent(
    """
    import torch
    from torch import nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(16, 16)

        def forward(self, x):
            if x.sum().item() > 1e9:  # a data-dependent branch: no fake tensor has a value
                x = x * 2
            return self.linear(x)

    def get_init_inputs():
        return []

    def get_inputs():
        return [torch.randn(4, 16)]
    """
)


def test_a_model_that_fails_on_fake_tensors_runs_anyway_with_the_reason(tmp_path: Path) -> None:
    from tpu_tuner.runner.jobs import WorkerState, run_measure
    from tpu_tuner.runner.requests import MeasureRequest

    path = tmp_path / "hostile.py"
    path.write_text(FAKE_HOSTILE)
    state = WorkerState(str(path), "cpu")
    estimate = estimate_or_refuse(state.workload, state.backend, Candidate(), None, None, 1, "a limit of 1 byte")
    assert estimate.step_bytes is None and "does not run on fake tensors" in str(estimate.reason)
    m = run_measure(state, MeasureRequest(candidate={}, model_flops_per_step=1.0, peak_flops_per_s={"float32": 1e12}))
    assert m.step_median > 0 and m.estimated_peak_bytes is None and m.estimate_error is None
    assert m.estimate_note is not None and "fake tensors" in m.estimate_note
