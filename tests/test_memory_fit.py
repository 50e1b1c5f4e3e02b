"""A training step too large for the device (profiling/memory_fit.py, issue 68 item 4): a tuning
run's profile fits it with the memory agent's first setting that fits, the run's space starts
from that setting, and the fp32 reference carries its memory knobs; `tpu-tune profile` and a step
that nothing fits are still refused with the estimate."""

from __future__ import annotations

import pytest
from conftest import FIXTURES

import tpu_tuner
from tpu_tuner.core.errors import UserInputError
from tpu_tuner.devices.cpu import CpuBackend
from tpu_tuner.execution.memory_estimate import estimate_step_memory
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.metrics.estimate import estimate_step
from tpu_tuner.model.workloads.loader import load_workload
from tpu_tuner.profiling.memory_fit import FITTED_NOTE
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.tuning.search.search_space import SearchSpace

GPT, BATCH = FIXTURES / "tiny_gpt.py", 32
CHECKPOINTED = {"activation_checkpointing": "blocks"}


@pytest.fixture
def device_just_below_the_step(monkeypatch) -> int:
    """The CPU made to offer one byte less than the step as written needs (the meta estimate):
    checkpointed blocks fit, by their fake-tensor estimate."""
    workload = load_workload(GPT)
    needed = estimate_step(workload, BATCH, None).memory_bytes
    checkpointed = estimate_step_memory(workload, CpuBackend(), Candidate(CHECKPOINTED), BATCH).step_bytes
    assert checkpointed is not None and checkpointed < 0.9 * (needed - 1), (checkpointed, needed)
    monkeypatch.setattr(CpuBackend, "available_memory_bytes", lambda self, total: needed - 1)
    return needed


def test_a_tuning_runs_profile_fits_the_step_with_checkpointed_blocks(device_just_below_the_step, fast_settings):
    profile = tpu_tuner.profile(GPT, device="cpu", batch_size=BATCH, settings=fast_settings, fit_memory=True)
    assert profile.fitted_to_memory == CHECKPOINTED
    assert profile.candidate["activation_checkpointing"] == "blocks"
    assert any(w.startswith(FITTED_NOTE) and "checkpointed blocks" in w for w in profile.warnings)
    # The fp32 reference keeps its arithmetic (eager, highest) and takes the memory knob.
    reference = profile.fp32_reference()
    assert reference is not None and reference["activation_checkpointing"] == "blocks"
    assert reference["matmul_precision"] == "highest" and reference["execution"] == "eager"
    # Read back from profile.json as written.
    assert Profile.from_json(profile.to_json()).fitted_to_memory == CHECKPOINTED


def test_the_profile_command_still_refuses_the_step(device_just_below_the_step, fast_settings):
    with pytest.raises(UserInputError, match="one step needs ~.*pass --batch-size"):
        tpu_tuner.profile(GPT, device="cpu", batch_size=BATCH, settings=fast_settings)


def test_a_step_nothing_fits_is_refused_naming_what_was_tried(monkeypatch, fast_settings):
    monkeypatch.setattr(CpuBackend, "available_memory_bytes", lambda self, total: 1 << 20)
    with pytest.raises(UserInputError, match="neither checkpointed blocks nor 2 or 4 micro-batches fit"):
        tpu_tuner.profile(GPT, device="cpu", batch_size=BATCH, settings=fast_settings, fit_memory=True)


def test_the_space_starts_from_the_fitted_setting() -> None:
    space = SearchSpace.load("default", "tpu")
    fitted = space.starting_from({**CHECKPOINTED, "micro_batches": "2"})
    assert fitted.baseline_params()["activation_checkpointing"] == "blocks"
    assert fitted.baseline_params()["micro_batches"] == "2"
    # Every other choice is kept, and nothing else moves.
    before = {p.name: set(p.choices) for p in space.params}
    assert {p.name: set(p.choices) for p in fitted.params} == before
    moved = ("activation_checkpointing", "micro_batches")
    unchanged = {k: v for k, v in space.baseline_params().items() if k not in moved}
    assert {k: fitted.baseline_params()[k] for k in unchanged} == unchanged
    assert space.starting_from({}) is space


def test_the_workers_reference_is_the_fitted_one(fast_settings, tmp_path) -> None:
    """A measure request naming the fitted reference: the worker computes and stores that one
    (checkpointed blocks, fp32), and the baseline it judges against is the fitted baseline."""
    from tpu_tuner.execution.reference_store import key_of
    from tpu_tuner.runner.jobs import WorkerState, run_measure
    from tpu_tuner.runner.requests import MeasureRequest

    baseline = Candidate({**Candidate.baseline("cpu").to_dict(), **CHECKPOINTED})
    reference = Candidate({"execution": "eager", "matmul_precision": "highest", **CHECKPOINTED})
    state = WorkerState(str(GPT), "cpu")
    request = MeasureRequest(
        candidate=Candidate({**baseline.to_dict(), "matmul_precision": "medium"}).to_dict(),
        settings=fast_settings,
        model_flops_per_step=1e6,
        peak_flops_per_s={"float32": 1e12},
        baseline=baseline.to_dict(),
        references_dir=str(tmp_path),
        reference=reference.to_dict(),
    )
    measured = run_measure(state, request)
    assert state.reference_candidate == reference
    assert (tmp_path / key_of(reference.to_dict(), None, None)).exists()
    assert measured.accuracy_errors["gradients"] < 1e-2  # checkpointing changed nothing it computes


def test_the_report_says_the_step_as_written_does_not_fit(tmp_path) -> None:
    from helpers.common import window_result

    from tpu_tuner.outputs.tuning_report import render_report

    result = window_result(tmp_path)
    assert "does not fit the device" not in render_report(result, {})
    note = f"{FITTED_NOTE} ~50.8 GiB (meta device), 16 GiB available: the baseline is eager, checkpointed blocks"
    result.profile.fitted_to_memory, result.profile.warnings = dict(CHECKPOINTED), [note]
    said = render_report(result, {})
    assert f"**The step as written does not fit the device**: {note}." in said


DEVICE_LINE = "RuntimeError: a required argument is in a failed state (the device: RESOURCE_EXHAUSTED: allocating 256M)"


def test_a_step_that_ran_out_of_device_memory_is_fitted_past_what_ran_out(fast_settings):
    """The estimate says the step fits; the device said otherwise (a v5e chip, docs/torchtpu.md):
    the profile takes the memory agent's next setting after each that ran out."""
    once = tpu_tuner.profile(
        GPT, device="cpu", batch_size=BATCH, settings=fast_settings, fit_memory=True, ran_out=(DEVICE_LINE,)
    )
    assert once.fitted_to_memory == CHECKPOINTED
    note = next(w for w in once.warnings if w.startswith(FITTED_NOTE))
    assert "1 profile(s) ran out of device memory (the first: RuntimeError: a required argument" in note
    assert note.endswith("settings that ran")
    twice = tpu_tuner.profile(
        GPT, device="cpu", batch_size=BATCH, settings=fast_settings, fit_memory=True, ran_out=(DEVICE_LINE,) * 2
    )
    assert twice.fitted_to_memory == {"activation_checkpointing": "blocks", "micro_batches": "2"}
    with pytest.raises(UserInputError, match=r"ran out of device memory in 4 profile\(s\), as given or under"):
        tpu_tuner.profile(
            GPT, device="cpu", batch_size=BATCH, settings=fast_settings, fit_memory=True, ran_out=(DEVICE_LINE,) * 4
        )


def test_a_step_fitted_by_its_estimate_that_ran_out_takes_the_next_setting(device_just_below_the_step, fast_settings):
    """The first profile was already fitted (checkpointed blocks, by the estimate) and ran out: the
    next takes the ladder's next setting, not checkpointed blocks again."""
    again = tpu_tuner.profile(
        GPT, device="cpu", batch_size=BATCH, settings=fast_settings, fit_memory=True, ran_out=(DEVICE_LINE,)
    )
    assert again.fitted_to_memory == {"activation_checkpointing": "blocks", "micro_batches": "2"}


def test_a_tuning_run_profiles_its_baseline_again_after_the_device_ran_out() -> None:
    """profile_baseline: a profile that ran out of device memory is asked for again, in a fresh
    worker, with what ran out; an inference step (nothing to fit) is not."""
    from types import SimpleNamespace

    from tpu_tuner.core.errors import WorkloadError
    from tpu_tuner.core.failures import FailureKind
    from tpu_tuner.execution.measurement import TrialFailure
    from tpu_tuner.runner.trial_runner import JobResult
    from tpu_tuner.tuning.options.tune_options import RunnerOptions, TuneOptions
    from tpu_tuner.tuning.run.run_setup import profile_baseline

    requests: list = []
    answers = [JobResult(failure=TrialFailure(FailureKind.OOM, DEVICE_LINE)), JobResult(value="the profile")]
    runner = SimpleNamespace(run=lambda request: (requests.append(request), answers.pop(0))[1])
    options = TuneOptions(runner=RunnerOptions(device="tpu"))
    assert profile_baseline(runner, options, GPT, "tpu") == "the profile"  # type: ignore[arg-type]
    assert [r.ran_out for r in requests] == [(), (DEVICE_LINE,)]
    requests.clear()
    answers[:] = [JobResult(failure=TrialFailure(FailureKind.OOM, DEVICE_LINE)), JobResult(value="never")]
    with pytest.raises(WorkloadError, match=r"profiling the baseline failed \(oom\)"):
        profile_baseline(runner, options, GPT, "tpu", training=False)  # type: ignore[arg-type]
    assert len(requests) == 1
