"""Accuracy judged against the baseline (docs/tuning.md, "Accuracy against the baseline"): a
baseline off fp32 by more than the tolerance (TorchTPU's one bf16 pass on a TPU) passes its own
guardrail and can be verified; a setting is refused only when it is more than the tolerance less
accurate than the baseline, with its figures; relative errors neither underflow nor overflow."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
import torch
from conftest import FIXTURES

from tpu_tuner import TuneOptions, tune
from tpu_tuner.execution import accuracy
from tpu_tuner.execution.accuracy import Outputs, relative_error
from tpu_tuner.execution.measurement import EarlyStop, Measurement, accuracy_excess, accuracy_refusal
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.profiling import ProfilerSettings
from tpu_tuner.runner.jobs import WorkerState, run_measure
from tpu_tuner.runner.requests import MeasureRequest
from tpu_tuner.studies import records
from tpu_tuner.tuning.options.tune_options import ObjectiveOptions, OutputOptions, RunnerOptions, SearchOptions
from tpu_tuner.tuning.search import trial_attrs

GRADED = FIXTURES / "graded_accuracy.py"
BASELINE = Candidate(matmul_precision="medium")  # 1.2e-2 off fp32 (the fixture's)
TOLERANCE = 0.01


# --- relative errors in float64 ------------------------------------------------------------------


@pytest.mark.parametrize("magnitude", [1e-21, 1e21])
def test_relative_errors_neither_underflow_nor_overflow(magnitude: float) -> None:
    """float32 norms read 0 at 1e-21 (squares underflow) and NaN at 1e21 (inf / inf), and NaN
    passes any `> tolerance` check; in float64, scaled, both read the true 1e-3."""
    generator = torch.Generator().manual_seed(0)
    expected = torch.randn(1000, generator=generator) * magnitude
    got = expected * (1 + 1e-3 * torch.randn(1000, generator=generator))
    true = ((got.double() - expected.double()).norm() / expected.double().norm()).item()
    error = relative_error(Outputs({"output": got}), Outputs({"output": expected}))["output"]
    assert math.isfinite(error) and error == pytest.approx(true, rel=1e-9) and 5e-4 < error < 2e-3


def test_the_float64_sums_run_in_chunks_and_an_all_zero_reference_gives_the_absolute_error(monkeypatch) -> None:
    expected = torch.arange(1.0, 11.0)
    got = expected + torch.tensor([0.5] + [0.0] * 9)
    whole = relative_error(Outputs({"o": got}), Outputs({"o": expected}))["o"]
    monkeypatch.setattr(accuracy, "CHUNK", 3)  # four chunks, the last one short
    assert relative_error(Outputs({"o": got}), Outputs({"o": expected}))["o"] == pytest.approx(whole, rel=1e-12)
    assert whole == pytest.approx(0.5 / math.sqrt(sum(i * i for i in range(1, 11))), rel=1e-9)
    zeros = relative_error(Outputs({"o": torch.tensor([3.0, 4.0])}), Outputs({"o": torch.zeros(2)}))
    assert zeros["o"] == pytest.approx(5.0)
    assert relative_error(Outputs({"o": torch.tensor([math.nan])}), Outputs({"o": torch.ones(1)}))["o"] == math.inf


# --- the rule --------------------------------------------------------------------------------------


def test_the_excess_is_judged_part_by_part() -> None:
    """A loss 1.5e-2 worse than the baseline's is refused even where the largest errors (the
    gradients') match: the largest minus the largest would read 0."""
    errors, baseline = {"loss": 0.0151, "gradients": 0.019}, {"loss": 1e-4, "gradients": 0.019}
    assert accuracy_excess(errors, baseline) == pytest.approx(0.015)
    message = accuracy_refusal(errors, baseline, TOLERANCE)
    assert message == (
        "accuracy error (loss) 1.51e-02 vs fp32, baseline 1.00e-04: 1.50e-02 more than the baseline > tolerance 0.01"
    )
    assert accuracy_excess(errors, {}) == 0.019  # no baseline figures (an older record): against fp32
    assert accuracy_refusal(errors, {}, TOLERANCE) == "accuracy error 0.019 > tolerance 0.01"  # as before
    # A baseline with no finite output sets no level: the setting is judged against fp32.
    assert accuracy_excess({"output": 0.02}, {"output": math.inf}) == 0.02
    assert accuracy_excess({"output": math.inf}, {"output": 0.02}) == math.inf


def _measurement(errors: dict[str, float], baseline: dict[str, float], vs_baseline: dict[str, float]) -> Measurement:
    return Measurement(
        candidate=Candidate().to_dict(),
        step_median=0.01,
        step_p10=0.01,
        step_p90=0.01,
        samples=[0.01],
        first_call_seconds=0.01,
        warmup_seconds=0.0,
        compile_seconds=0.0,
        compiles={},
        model_flops_per_step=1e6,
        peak_flops_per_s=1e12,
        peak_dtype="float32",
        mfu=0.1,
        peak_memory_bytes=None,
        accuracy_errors=errors,
        baseline_errors=baseline,
        errors_vs_baseline=vs_baseline,
    )


def test_the_stored_trial_is_feasible_by_its_excess_and_a_repeat_carries_it() -> None:
    study = optuna.create_study()
    baseline = {"output": 0.0193}  # the chip's baseline against fp32
    stored = {}
    for name, error in (("baseline", 0.0193), ("close", 0.025), ("far", 0.031)):
        trial = study.ask()
        trial_attrs.record_measurement(trial, _measurement({"output": error}, baseline, {"output": 0.01}), 100, 0.01)
        study.tell(trial, 0.01)
        stored[name] = study.trials[-1]
    attrs = {name: records.attrs(t) for name, t in stored.items()}
    assert attrs["baseline"][records.FEASIBLE] and attrs["baseline"][records.ACCURACY_EXCESS] == 0.0
    assert attrs["close"][records.FEASIBLE]
    assert not attrs["far"][records.FEASIBLE] and attrs["far"][records.FAILURE_KIND] == "accuracy"
    assert attrs["far"][records.FAILURE_MESSAGE] == (
        "accuracy error 3.10e-02 vs fp32, baseline 1.93e-02: 1.17e-02 more than the baseline > tolerance 0.01"
    )
    assert attrs["far"][records.BASELINE_ACCURACY_ERROR] == 0.0193
    assert attrs["far"][records.ACCURACY_ERROR_VS_BASELINE] == 0.01
    repeat = study.ask()
    trial_attrs.copy_attrs(stored["close"], repeat, 0.01)
    study.tell(repeat, 0.01)
    # Optuna's constraint: feasible when <= 0; the excess's, not the fp32 error's (which is 1.5e-2 over).
    assert study.trials[-1].constraints["accuracy"] == pytest.approx(0.025 - 0.0193 - 0.01)
    stop = EarlyStop(Candidate().to_dict(), "steps", "too slow", [0.1], 0.1, 0.0, 0.1, {"output": 0.031}, baseline)
    stopped = study.ask()
    trial_attrs.record_early_stop(stopped, stop, 0.01)
    study.tell(stopped, state=optuna.trial.TrialState.PRUNED)
    assert records.attrs(study.trials[-1])[records.FAILURE_MESSAGE].startswith("accuracy error 3.10e-02 vs fp32")


def test_failure_learning_reads_an_accuracy_failure_by_the_excess_not_the_fp32_error() -> None:
    """A setting as far from fp32 as the chip's baseline (1.93e-2, over the 0.01 tolerance) got past
    the guardrail: the learner must not count it an accuracy failure of its knob values."""
    from tpu_tuner.studies.trial_record import TrialRecord
    from tpu_tuner.tuning.search.failure_learning import evidence_of
    from tpu_tuner.tuning.search.tuning_trial import TuningTrial

    study = optuna.create_study()
    baseline = {"output": 0.0193}
    for error in (0.0193, 0.031):
        trial = study.ask()
        TrialRecord.of(trial).update({records.MEASURED: True})
        measured = _measurement({"output": error}, baseline, {"output": error - 0.0193})
        study.tell(trial, trial_attrs.record_measurement(trial, measured, 100, TOLERANCE))
    passed, failed = evidence_of(TuningTrial.all(study.trials), TOLERANCE)
    assert passed.outcomes["accuracy"] is False and failed.outcomes["accuracy"] is True


# --- in the worker ---------------------------------------------------------------------------------


def test_the_worker_judges_each_setting_against_the_baseline(fast_settings: ProfilerSettings) -> None:
    state = WorkerState(str(GRADED), "cpu")

    def measure(candidate: Candidate) -> Measurement:
        request = MeasureRequest(
            candidate=candidate.to_dict(),
            settings=fast_settings,
            model_flops_per_step=1e6,
            peak_flops_per_s={"float32": 1e12, "bfloat16": 1e12},
            baseline=BASELINE.to_dict(),
        )
        m = run_measure(state, request)
        assert isinstance(m, Measurement)
        return m

    base = measure(BASELINE)
    # Over the tolerance against fp32, as TorchTPU's default is on the chip, yet not refused.
    assert base.accuracy_error > TOLERANCE and base.accuracy_error == pytest.approx(0.012, rel=1e-4)
    assert base.baseline_errors == base.accuracy_errors and base.accuracy_excess == 0.0
    assert base.error_vs_baseline == pytest.approx(0.0, abs=1e-7) and not base.accuracy_refused(TOLERANCE)
    exact = measure(Candidate())  # fp32: more accurate than the baseline
    assert exact.accuracy_error == 0.0 and exact.baseline_error == pytest.approx(0.012, rel=1e-4)
    assert exact.error_vs_baseline == pytest.approx(0.012 / 1.012, rel=1e-4)
    assert not exact.accuracy_refused(TOLERANCE)
    close = measure(Candidate(matmul_precision="medium", autocast="bfloat16"))  # 5e-3 less accurate
    assert close.accuracy_excess == pytest.approx(0.01706 - 0.012, rel=1e-3) and not close.accuracy_refused(TOLERANCE)
    far = measure(Candidate(matmul_precision="high"))  # 1.8e-2 less accurate
    assert far.accuracy_excess == pytest.approx(0.018, rel=1e-3) and far.accuracy_refused(TOLERANCE)
    assert accuracy_refusal(far.accuracy_errors, far.baseline_errors, TOLERANCE) == (
        "accuracy error 3.00e-02 vs fp32, baseline 1.20e-02: 1.80e-02 more than the baseline > tolerance 0.01"
    )


# --- a whole run -----------------------------------------------------------------------------------


@pytest.mark.slow  # a whole tuning run, its verification timed
@pytest.mark.timed  # verified: medium + bf16's 3 ms step against the baseline's 8 ms
def test_a_baseline_off_fp32_beyond_the_tolerance_is_verified_against(tmp_path: Path) -> None:
    """Judged against fp32 alone, the baseline (1.2e-2 off) failed its own guardrail and nothing
    was verified; judged against the baseline, the setting 5e-3 less accurate and 2.7x faster is."""
    options = TuneOptions(
        search=SearchOptions(
            space=FIXTURES / "graded_accuracy_space.toml", agents=(), trials=6, sampler="grid", prune=False
        ),
        objective=ObjectiveOptions(verify_rounds=6, tolerance=TOLERANCE),
        runner=RunnerOptions(
            trial_timeout_s=60.0,
            trial_settings=ProfilerSettings(
                warmup_min_steps=1,
                warmup_max_steps=5,
                timing_min_steps=10,
                timing_min_seconds=0.0,
                timing_max_steps=20,
                profiled_steps=1,
                top_operators=3,
            ),
        ),
        outputs=OutputOptions(out=tmp_path),
    )
    result = tune(GRADED, options)
    frame = result.trials_dataframe()
    rows = {(r["matmul_precision"], r["autocast"]): r for _, r in frame.iterrows()}
    baseline = rows[("medium", "none")]
    assert baseline["feasible"] and baseline[records.ACCURACY_ERROR] == pytest.approx(0.012, rel=1e-4)
    assert rows[("medium", "bfloat16")]["feasible"] and rows[("highest", "none")]["feasible"]
    high = rows[("high", "none")]
    assert not high["feasible"] and high[records.FAILURE_KIND] == "accuracy"
    assert "3.00e-02 vs fp32, baseline 1.20e-02: 1.80e-02 more than the baseline" in high[records.FAILURE_MESSAGE]
    assert high[records.BASELINE_ACCURACY_ERROR] == pytest.approx(0.012, rel=1e-4)
    v = result.verification
    assert v.chosen_is_best and v.chosen == Candidate(matmul_precision="medium", autocast="bfloat16"), v.message
    report = (result.run_dir / "report.md").read_text()
    assert "the baseline's own: 1.20e-02" in report and "| error vs fp32 | vs baseline |" in report
    assert "| accuracy error vs the baseline's outputs |" in report
    # "high" is faster than the baseline and refused: the note gives its figures against both.
    assert "error 3.00e-02 vs fp32, baseline 1.20e-02: 1.80e-02 more than the baseline: 80% over" in report
    assert records.ACCURACY_ERROR_VS_BASELINE in (result.run_dir / "trials.csv").read_text().splitlines()[0]
