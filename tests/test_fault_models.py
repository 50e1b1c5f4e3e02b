"""The fault models of benchmarks/tuning/failure_learning.py fault under their knob value, and only there.

Each model is run directly under the knob's state (bf16 autocast, a one-thread process, four
micro-batches' slice, dynamo's fullgraph tracing), never through a tuning run, so the check takes
seconds; the crash runs in a subprocess. Without it the benchmark's figures could silently turn
into zeros: a fault that stops firing looks exactly like a tuner that learned to avoid it. Also
checked: each bad value is a choice of the default CPU space (the benchmark matches it by name
in trials.csv), and the benchmark's reader counts measured trials by attributes, not state.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from tpu_tuner.core.definitions import load_definition
from tpu_tuner.model.workloads.loader import load_workload
from tpu_tuner.model.workloads.workload import Workload, call_model
from tpu_tuner.runner.worker_process import failure_of

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks" / "tuning"
FAULT_MODELS = BENCHMARKS / "fault_models"
TOLERANCE = 0.01  # tpu-tune's default accuracy tolerance


def _benchmark() -> types.ModuleType:
    """benchmarks/tuning/failure_learning.py as a module (it imports its sibling _failure_runs)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("failure_learning_under_test", BENCHMARKS / "failure_learning.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def _load(name: str) -> Workload:
    return load_workload(FAULT_MODELS / f"{name}_model.py")


def _forward(workload: Workload, model: torch.nn.Module | None = None) -> torch.Tensor:
    """One no-grad forward on the workload's seeded batch (seeded weights too, when built here)."""
    torch.manual_seed(0)
    if model is None:
        model = workload.build_model()
    torch.manual_seed(1)
    inputs, _ = workload.split_batch(workload.batch(None, None))
    with torch.no_grad():
        return call_model(model, inputs)


def _relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.float() - expected.float()).norm() / expected.float().norm()).item()


@pytest.fixture
def threads():
    """Restore the process's intra-op threads after a test changes them."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_every_bad_value_is_a_choice_of_the_default_cpu_space():
    entries = load_definition("search_spaces", "default")["param"]
    choices = {entry["name"]: entry["choices"]["cpu"] for entry in entries if "cpu" in entry["choices"]}
    for model in _benchmark().MODELS:
        assert model.path.exists()
        assert model.bad.value in choices[model.bad.param], model


def test_crash_model_dies_with_sigsegv_under_bf16_autocast():
    """The real thing once, in a child: the signal the trial worker reports as a crash."""
    # The file imported as it is (no tpu_tuner): the child's start-up is torch's import alone.
    script = textwrap.dedent(f"""
        import importlib.util, torch
        spec = importlib.util.spec_from_file_location("crash_model", {str(FAULT_MODELS / "crash_model.py")!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            module.Model(*module.get_init_inputs())(*module.get_inputs())
        print("survived")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGSEGV, (done.returncode, done.stdout, done.stderr[-2000:])


class Killed(Exception):
    """os.kill, intercepted: the crash model's fault fired (with this signal)."""


@pytest.mark.parametrize("backend", [None, "aot_eager"])
def test_crash_model_fault_fires_under_bf16_only_eager_and_compiled(backend, monkeypatch):
    """In-process, os.kill intercepted: fp32 runs, bf16 fires, compiled too. A compiled graph
    runs with autocast off inside (its casts are baked in), so a fault that read the state at
    step time would not fire there (one did not: every compiled bf16 trial ran)."""

    def kill(pid: int, sig: int) -> None:
        raise Killed(sig)

    monkeypatch.setattr(os, "kill", kill)
    workload = _load("crash")
    torch.manual_seed(0)
    model = workload.build_model()
    torch._dynamo.reset()
    if backend is not None:
        model = torch.compile(model, backend=backend)
    assert torch.isfinite(_forward(workload, model)).all()  # fp32: fine (compiled: a graph without the fault)
    with pytest.raises(Killed) as killed, torch.autocast("cpu", dtype=torch.bfloat16):
        _forward(workload, model)
    assert killed.value.args == (signal.SIGSEGV,)
    torch._dynamo.reset()


def test_oom_model_runs_out_of_memory_on_four_micro_batches_only():
    workload = _load("oom")
    assert workload.is_training and workload.loss_fn is not None
    batch = workload.batch_size
    assert batch == 8
    model = workload.build_model()
    inputs, target = workload.split_batch(workload.batch(batch, None))
    for k in (1, 2):  # the whole batch, and two micro-batches: fine
        rows = batch // k
        workload.loss_fn(model(inputs[:rows]), target[:rows]).backward()
    rows = batch // 4
    with pytest.raises(RuntimeError) as raised:
        workload.loss_fn(model(inputs[:rows]), target[:rows])
    assert failure_of(raised.value)[0] == "oom"  # what the trial worker records


def test_accuracy_model_is_off_on_one_thread_only(threads):
    workload = _load("accuracy")
    torch.set_num_threads(2)
    reference = _forward(workload)
    torch.set_num_threads(1)
    assert _relative_error(_forward(workload), reference) > 10 * TOLERANCE
    torch.set_num_threads(2)
    assert _relative_error(_forward(workload), reference) == 0


def test_bf16_autocast_passes_the_guardrail_where_it_is_not_the_fault():
    """bf16's own rounding must stay inside the tolerance, or bf16 becomes a second bad value."""
    for name in ("accuracy", "fullgraph"):
        workload = _load(name)
        reference = _forward(workload)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert _relative_error(_forward(workload), reference) < TOLERANCE, name


def test_fullgraph_model_fails_under_fullgraph_only():
    """Dynamo's tracing decides it (the backend compiles nothing here: "eager" keeps the test fast)."""
    workload = _load("fullgraph")
    torch.manual_seed(0)
    model = workload.build_model()
    reference = _forward(workload, model)
    torch._dynamo.reset()
    assert torch.allclose(_forward(workload, torch.compile(model, backend="eager")), reference)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="data-dependent|graph break|item"):
        _forward(workload, torch.compile(model, backend="eager", fullgraph=True))
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["crash", "accuracy"])
def test_custom_op_faults_compile_as_one_graph(name):
    """The crash and accuracy faults sit in opaque custom operators, so fullgraph traces them:
    fullgraph is not a second fault of those models (fp32, default threads: no fault fires)."""
    workload = _load(name)
    torch.manual_seed(0)
    model = workload.build_model()
    reference = _forward(workload, model)
    torch._dynamo.reset()
    assert torch.allclose(_forward(workload, torch.compile(model, backend="eager", fullgraph=True)), reference)
    torch._dynamo.reset()


def test_reader_counts_measured_trials_by_attributes_not_state():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from _failure_runs import BadValue, is_measured
    finally:
        sys.path.remove(str(BENCHMARKS))
    measured = [
        {"state": "COMPLETE", "trial_wall_s": "1.2", "amortised_step_s": "0.01"},
        {"state": "FAIL", "trial_wall_s": "0.1", "failure_kind": "crash"},
        {"state": "PRUNED", "failure_kind": "oom", "trial_wall_s": "0.3"},  # a failure told as pruned
        {"state": "PRUNED", "measured": "True", "failure_kind": "error"},
    ]
    unmeasured = [
        {"state": "COMPLETE", "repeat_of": "0", "amortised_step_s": "0.01"},  # trial 0 is a trial number
        {"state": "FAIL", "repeat_of": "3", "failure_kind": "crash"},
        {"state": "PRUNED", "rejected_by": "precision: ..."},
        {"state": "PRUNED", "excluded_by": "autocast=bfloat16 failed in trials 2, 5", "failure_kind": "crash"},
        {"state": "PRUNED", "excluded": "True", "failure_kind": "crash"},
        {"state": "PRUNED", "over_budget": "True"},
        {"state": "WAITING"},
    ]
    assert all(is_measured(row) for row in measured)
    assert not any(is_measured(row) for row in unmeasured)
    fullgraph = BadValue("compile_options", "fullgraph", "error")
    assert fullgraph.matches({"compile_options": "fullgraph"})
    assert fullgraph.matches({"compile_options": "freezing+fullgraph"})
    assert not fullgraph.matches({"compile_options": "freezing"}) and not fullgraph.matches({})
