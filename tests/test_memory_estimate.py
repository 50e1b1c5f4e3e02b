"""Memory before measurement: a step's peak estimated on fake tensors (execution/memory_estimate.py)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from helpers.common import allocation_peak  # noqa: E402

from tpu_tuner.core.failures import FailureKind, classify  # noqa: E402
from tpu_tuner.devices import get_backend  # noqa: E402
from tpu_tuner.execution.memory_estimate import (  # noqa: E402
    MemoryEstimate,
    as_of_now,
    estimate_or_refuse,
    estimate_step_memory,
    over_limit,
)
from tpu_tuner.execution.step import prepare_step  # noqa: E402
from tpu_tuner.knobs.candidate import Candidate  # noqa: E402
from tpu_tuner.model.workloads.loader import load_workload  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GPT = ROOT / "examples" / "gpt.py"


@pytest.mark.slow  # two real training steps profiled for their allocations: about 14 s on 2 cores
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


def test_micro_batches_are_estimated_though_they_forward_the_model_twice_a_step() -> None:
    """Issue 69, item 3: torch's tracker refused a root module's second forward in one step ("multiple
    iterative calls"), so every micro-batched trial ran unestimated. Its stats start afresh there."""
    workload, backend = load_workload(str(GPT)), get_backend("cpu")
    whole = estimate_step_memory(workload, backend, Candidate.baseline("cpu"), 8, 64)
    halves = estimate_step_memory(workload, backend, Candidate(micro_batches="2"), 8, 64)
    assert halves.reason is None and halves.step_bytes is not None and whole.step_bytes is not None
    assert halves.step_bytes < whole.step_bytes  # half the activations live at a time


@pytest.mark.slow  # two real training steps profiled for their allocations
def test_a_micro_batched_estimate_is_within_ten_percent_of_the_allocated_peak() -> None:
    workload, backend, candidate = load_workload(str(GPT)), get_backend("cpu"), Candidate(micro_batches="2")
    estimate = estimate_step_memory(workload, backend, candidate, 8, 64)
    measured = allocation_peak(lambda: prepare_step(workload, backend, candidate, 8, 64))
    assert estimate.step_bytes is not None and abs(estimate.step_bytes / measured - 1) < 0.10, (
        estimate.step_bytes,
        measured,
    )


def test_a_heap_that_keeps_freed_memory_adds_what_the_step_s_mapped_tensors_cannot_reuse(monkeypatch) -> None:
    # A CPU process whose malloc holds 1 GiB freed: gpt's large tensors (its logits above all)
    # are mapped afresh beside it, so the estimate adds to the step's own peak (heap_model.py);
    # on an allocator that keeps nothing (None: not glibc) it adds nothing.
    workload, backend, candidate = load_workload(str(GPT)), get_backend("cpu"), Candidate.baseline("cpu")
    monkeypatch.setattr(backend, "free_heap_bytes", lambda: 2**30)
    kept = estimate_step_memory(workload, backend, candidate, 2, 64)
    assert kept.step_bytes is not None and kept.peak_bytes is not None
    assert 0 < kept.retained_bytes and kept.retained_bytes + kept.step_bytes >= 2**30
    monkeypatch.setattr(backend, "free_heap_bytes", lambda: None)
    plain = as_of_now(kept, backend)  # the kept estimate read again, as a cached one is
    assert plain.retained_bytes == 0 and plain.step_bytes == kept.step_bytes


def test_the_heap_s_growth_replayed_through_malloc_is_added_where_the_model_says_less(monkeypatch) -> None:
    # The model reuses every freed byte; glibc's own heap, replayed (malloc_replay.py), grew by
    # 300 MiB from a resident set holding 50 MiB free: the estimate reaches 300 MiB above that
    # resident set (the step's 100 MiB and 250 beyond it), and the model's where nothing replays.
    from tpu_tuner.execution import memory_estimate
    from tpu_tuner.execution.heap_model import Change

    mib = 2**20
    backend = get_backend("cpu")
    monkeypatch.setattr(backend, "free_heap_bytes", lambda: 50 * mib)
    made = MemoryEstimate(100 * mib, changes=(Change(1, 0, 100 * mib, True),))
    monkeypatch.setattr(memory_estimate, "heap_growth", lambda changes: 300 * mib)
    assert as_of_now(made, backend).retained_bytes == 250 * mib
    monkeypatch.setattr(memory_estimate, "heap_growth", lambda changes: None)
    assert as_of_now(made, backend).retained_bytes == 50 * mib  # the model: mapped beside the free heap


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
    from tpu_tuner.model.workloads.loader import load_workload

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


@pytest.mark.slow  # a forced run out of memory in a subprocess: about 9 s on 2 cores
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
    # What failed and where, in a line: a library's own message (torch's MemTracker asked users to
    # "file a github issue" in a report) stays in the workers' log.
    assert re.fullmatch(r"the step does not run on fake tensors \(\w+ in [\w./-]+\.py\)", str(estimate.reason))
    m = run_measure(state, MeasureRequest(candidate={}, model_flops_per_step=1.0, peak_flops_per_s={"float32": 1e12}))
    assert m.step_median > 0 and m.estimated_peak_bytes is None and m.estimate_error is None
    assert m.estimate_note is not None and "fake tensors" in m.estimate_note


# --- sharded trials: each rank on torch's fake process group ------------------------------------

TINY_LLAMA = ROOT / "tests" / "fixtures" / "tiny_llama.py"


@pytest.mark.slow  # every layout estimated on a fake process group: about 6 s on 2 cores
def test_each_layout_s_rank_is_estimated_on_its_own_shard() -> None:
    from tpu_tuner.execution.rank_memory import estimate_rank_memory

    workload, backend = load_workload(str(TINY_LLAMA)), get_backend("cpu")
    batch = workload.batch_size or 8
    single = estimate_step_memory(workload, backend, Candidate(), batch, None)
    half = estimate_step_memory(workload, backend, Candidate(), batch // 2, None)
    backend.ranks = 2
    try:
        ranks = {
            layout: estimate_rank_memory(workload, backend, Candidate(layout=layout), batch, None, 0, 2)
            for layout in ("2x1x1", "1x2x1", "1x1x2")
        }
    finally:
        backend.ranks = 1
    assert not torch.distributed.is_initialized()  # the fake group is left: a real one may be joined
    assert single.floor_bytes and half.step_bytes and half.floor_bytes
    for layout, estimate in ranks.items():
        assert estimate.reason is None and estimate.step_bytes and estimate.floor_bytes, (layout, estimate)
    # DDP: the unsharded step on the rank's half of the batch, plus one flat copy of the gradients.
    params = sum(p.numel() * p.element_size() for p in workload.build_model().parameters())
    assert ranks["2x1x1"].step_bytes == half.step_bytes + params
    assert ranks["2x1x1"].floor_bytes == half.floor_bytes + params
    # FSDP and tensor parallelism hold a shard of the weights, gradients and optimizer state a
    # rank (on the whole batch under tensor parallelism, half of it under FSDP): less than one process.
    for layout in ("1x2x1", "1x1x2"):
        assert ranks[layout].floor_bytes < single.floor_bytes, (layout, ranks[layout], single)
        assert ranks[layout].step_bytes < single.step_bytes, (layout, ranks[layout], single)


def test_trials_that_differ_only_in_memory_neutral_settings_share_one_estimate(monkeypatch) -> None:
    from tpu_tuner.execution import memory_estimate

    base = Candidate()
    neutral = Candidate(matmul_precision="medium", intra_op_threads="1", execution="inductor")
    autotuned = Candidate(execution="inductor", compile_options="max-autotune")
    assert len({memory_estimate.memory_key(c, 8, 64, "cpu") for c in (base, neutral, autotuned)}) == 1
    for other in (Candidate(autocast="bfloat16"), Candidate(execution="inductor", compile_options="freezing")):
        assert memory_estimate.memory_key(other, 8, 64, "cpu") != memory_estimate.memory_key(base, 8, 64, "cpu"), other
    assert memory_estimate.memory_key(base, 16, 64, "cpu") != memory_estimate.memory_key(base, 8, 64, "cpu")

    made: list[Candidate] = []

    def fake_estimate(workload, backend, candidate, batch_size, seq_len):  # type: ignore[no-untyped-def]
        made.append(candidate)
        return MemoryEstimate(step_bytes=100, in_use_bytes=1, seconds=3.0, floor_bytes=50)

    monkeypatch.setattr(memory_estimate, "estimate_step_memory", fake_estimate)
    backend, cache = get_backend("cpu"), {}  # type: ignore[var-annotated]
    first = memory_estimate.cached_estimate(None, backend, base, 8, 64, cache)  # type: ignore[arg-type]
    again = memory_estimate.cached_estimate(None, backend, neutral, 8, 64, cache)  # type: ignore[arg-type]
    assert made == [base] and (first.step_bytes, again.step_bytes, again.floor_bytes) == (100, 100, 50)
    assert again.seconds == 0.0 and again.in_use_bytes > 1  # what the process holds, read again


def test_a_refused_setting_spends_no_trial() -> None:
    import optuna

    from tpu_tuner.studies import records
    from tpu_tuner.tuning.search.trials import TuneTrials

    def trial(kind: str) -> optuna.trial.FrozenTrial:
        return optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs={records.FAILURE_KIND: kind})

    assert not TuneTrials.spends(None, trial(FailureKind.WOULD_NOT_FIT))  # type: ignore[arg-type]
    assert TuneTrials.spends(None, trial(FailureKind.OOM))  # type: ignore[arg-type]


def test_a_trial_memory_limit_below_the_baseline_s_estimate_is_refused_before_any_trial() -> None:
    from types import SimpleNamespace

    from tpu_tuner.core.errors import UserInputError
    from tpu_tuner.profiling.profile import MemoryReport
    from tpu_tuner.tuning.run.run_setup import refuse_below_baseline
    from tpu_tuner.tuning.search.memory_limit import MemoryLimit

    profile = SimpleNamespace(memory=MemoryReport(2**30, "VmHWM", estimated_peak_bytes=3 * 2**29))
    with pytest.raises(UserInputError, match=r"--trial-memory-gb 1 is below the baseline's estimated peak.*1\.50 GiB"):
        refuse_below_baseline(MemoryLimit(2**30, "--trial-memory-gb"), profile)  # type: ignore[arg-type]
    refuse_below_baseline(MemoryLimit(2**31, "--trial-memory-gb"), profile)  # type: ignore[arg-type]
    refuse_below_baseline(MemoryLimit(2**30, "the device's memory"), profile)  # type: ignore[arg-type]


def test_a_trial_memory_limit_the_baseline_s_profile_runs_out_of_is_refused_in_one_line() -> None:
    from types import SimpleNamespace

    from tpu_tuner.core.errors import UserInputError
    from tpu_tuner.execution.measurement import TrialFailure
    from tpu_tuner.runner.trial_runner import JobResult
    from tpu_tuner.tuning.options.tune_options import ObjectiveOptions, RunnerOptions, TuneOptions
    from tpu_tuner.tuning.run.run_setup import profile_baseline

    oom = TrialFailure(
        FailureKind.REFUSED, "gpt.py: building the model failed: DefaultCPUAllocator: can't allocate memory"
    )
    runner = SimpleNamespace(run=lambda request: JobResult(failure=oom))
    options = TuneOptions(runner=RunnerOptions(device="cpu"), objective=ObjectiveOptions(memory_limit_bytes=3 * 2**29))
    with pytest.raises(UserInputError, match=r"^--trial-memory-gb 1\.5 is too little for the baseline itself"):
        profile_baseline(runner, options, GPT, "cpu")  # type: ignore[arg-type]


def test_the_device_peak_is_torchs_own_trackers_without_its_per_module_walk(monkeypatch) -> None:
    """The estimate keeps only the device's peak (torch's tracker also walks every module at every
    operator for per-module peaks: 21 of a 16-layer decoder's 33 s); the peak is the same."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from tpu_tuner.execution import memory_estimate

    workload, backend = load_workload(str(GPT)), get_backend("cpu")
    candidate = Candidate(activation_checkpointing="blocks")
    ours = estimate_step_memory(workload, backend, candidate, 2, 64).step_bytes

    class Torchs(memory_estimate._recording(MemTracker, "cpu")):  # type: ignore[misc]  # a class of torch's private module
        _update_peak_stats = MemTracker._update_peak_stats

    monkeypatch.setattr(memory_estimate, "_recording", lambda tracker_class, kind: Torchs)
    assert ours is not None and ours == estimate_step_memory(workload, backend, candidate, 2, 64).step_bytes
