"""MFU arithmetic from known numbers, and the published peak tables."""

from __future__ import annotations

import pytest
from conftest import FIXTURES, use_probe

import tpu_tuner
from tpu_tuner.core.hardware import GPU_SPECS, TPU_CHIPS, GpuSpec, gpu_spec_for_name, tpu_chip_for_name
from tpu_tuner.devices import roofline
from tpu_tuner.execution.measurement import Measurement
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.metrics.mfu import (
    MFU_CONVENTION,
    NO_MFU,
    PeakChoice,
    achieved_flops_per_s,
    checked_peak,
    fastest_peak,
    mfu,
    mfu_text,
    utilisation_by_dtype,
)
from tpu_tuner.metrics.timing import TimingStats
from tpu_tuner.outputs.profile_report import render_markdown


def test_mfu_from_known_numbers() -> None:
    # 459 TFLOP/s per v5p chip; 4 chips; a step of 918 TFLOP in 1 s uses half of them.
    assert mfu(918e12, 1.0, 459e12, devices=4) == pytest.approx(0.5)
    assert achieved_flops_per_s(1e12, 0.25) == 4e12
    with pytest.raises(ValueError):
        mfu(1.0, 0.0, 1.0)


# --- the peak tables: published figures for one device of each, relations for the rest ---------


def test_a_published_tpu_figure() -> None:
    # Google's TPU v5p page: 459 TFLOP/s bf16 and 95 GB of HBM per chip, one device per chip.
    chip = tpu_chip_for_name("TPU v5p")
    assert chip is not None and chip.generation == "v5p"
    assert chip.bf16_flops_per_device == pytest.approx(459e12)
    assert chip.hbm_bytes_per_device == 95 * 1024**3


def test_tpu_relations() -> None:
    # Trillium (v6e): "4.7x the peak compute per chip of TPU v5e" (Google's announcement).
    v5e, v6e = tpu_chip_for_name("TPU v5e"), tpu_chip_for_name("TPU v6e")
    assert v5e is not None and v6e is not None
    assert v6e.bf16_flops_per_device / v5e.bf16_flops_per_device == pytest.approx(4.7, rel=0.02)
    # TPU7x: two devices per chip, each with half the chip's compute and HBM (PyTorch sees devices).
    ironwood = tpu_chip_for_name("TPU7x")
    assert ironwood is not None and ironwood.devices_per_chip == 2
    assert ironwood.bf16_flops_per_device * 2 == pytest.approx(ironwood.bf16_tflops_per_chip * 1e12)
    assert ironwood.hbm_bytes_per_device * 2 == ironwood.hbm_bytes_per_chip
    assert ironwood.hbm_bytes_per_s_per_device * 2 == pytest.approx(ironwood.hbm_gbytes_per_s * 1e9)
    for chip in TPU_CHIPS.values():  # one device per chip elsewhere: the device is the chip
        assert chip is ironwood or chip.bf16_flops_per_device == pytest.approx(chip.bf16_tflops_per_chip * 1e12)


@pytest.mark.parametrize(
    ("name", "same_as"),
    [
        ("TPU v5 lite", "TPU v5e"),  # the name PJRT and torch report for v5e
        ("TPU v6 lite", "TPU v6e"),
        ("TPU v7", "TPU7x"),  # torch-tpu 0.2.0's get_device_name()
        ("Ironwood", "TPU7x"),
        ("Trillium", "TPU v6e"),
    ],
)
def test_tpu_names_that_mean_one_chip(name: str, same_as: str) -> None:
    assert tpu_chip_for_name(name) is not None and tpu_chip_for_name(name) is tpu_chip_for_name(same_as)


def test_every_tpu_generation_is_found_by_its_name() -> None:
    for generation, chip in TPU_CHIPS.items():
        assert tpu_chip_for_name(f"TPU {generation}") is chip
    assert tpu_chip_for_name("TPU v5p") is not tpu_chip_for_name("TPU v5e")


def test_tpu_memory_and_slice_naming() -> None:
    # "v5p-256" counts TensorCores (128 chips), "v5e-16" counts chips.
    assert TPU_CHIPS["v5p"].slice_name_counts_cores and not TPU_CHIPS["v5e"].slice_name_counts_cores
    assert tpu_chip_for_name("NVIDIA H100") is None


def test_a_published_gpu_figure() -> None:
    # NVIDIA's H100 SXM datasheet: 1,979 TFLOP/s bf16 with 2:4 sparsity, half that dense.
    h100 = gpu_spec_for_name("NVIDIA H100 80GB HBM3")
    assert h100 is not None and h100.name == "H100 SXM" and h100.tflops["bfloat16"] == pytest.approx(1979 / 2, rel=1e-3)


@pytest.mark.parametrize(
    ("name", "spec"),
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB"),
    ],
)
def test_gpu_names_find_their_datasheet(name: str, spec: str) -> None:
    found = gpu_spec_for_name(name)
    assert found is not None and found.name == spec


def test_gpu_relations() -> None:
    def spec(name: str) -> GpuSpec:
        found = gpu_spec_for_name(name)
        assert found is not None
        return found

    # The H200 is the H100 SXM's silicon with faster memory; the PCIe H100 runs slower clocks.
    h200, sxm, pcie = spec("NVIDIA H200"), spec("NVIDIA H100 80GB HBM3"), spec("NVIDIA H100 PCIe")
    assert h200.tflops == sxm.tflops and h200.hbm_gbytes_per_s > sxm.hbm_gbytes_per_s
    assert all(pcie.tflops[k] < sxm.tflops[k] for k in sxm.tflops)
    # The A100's two memory sizes share one chip.
    assert spec("NVIDIA A100-SXM4-80GB").tflops == spec("NVIDIA A100-PCIE-40GB").tflops
    for _, entry in GPU_SPECS:  # dense tensor-core rates: fp16 as fast as bf16, each above tf32 and fp32
        rates = entry.tflops
        if "bfloat16" in rates:
            assert rates["float16"] == rates["bfloat16"]
            assert rates["float32"] < rates["tf32"] < rates["bfloat16"]
        assert rates["float32"] < rates["float16"]


def test_unknown_gpu_has_no_table_entry() -> None:
    assert gpu_spec_for_name("Some Future GPU") is None


def test_timing_stats_spread() -> None:
    stats = TimingStats.from_samples([float(x) for x in range(1, 12)])
    assert stats.median == 6 and stats.p10 == 2 and stats.p90 == 10 and stats.count == 11
    with pytest.raises(ValueError):
        TimingStats.from_samples([])


# --- one MFU convention: the fastest dtype's peak, never above 100% (issue 12, items 4 and 5) ---


def test_fastest_peak_is_the_mfu_peak_of_every_device_kind() -> None:
    # A CPU without fast bf16 (AVX-512F only): fp32 is its fastest measured rate.
    assert fastest_peak({"float32": 300e9, "bfloat16": 60e9}) == (300e9, "float32")
    # A CPU with AMX: bf16.
    assert fastest_peak({"float32": 300e9, "bfloat16": 1200e9}) == (1200e9, "bfloat16")
    # A GPU: the datasheet's dense bf16 (equal to fp16; bf16 is the dtype MFU is quoted in).
    h200 = gpu_spec_for_name("NVIDIA H200")
    assert h200 is not None
    assert fastest_peak({k: v * 1e12 for k, v in h200.tflops.items()}) == (989.4e12, "bfloat16")
    # A TPU: bf16 per chip, as TorchTPU's table (the backend lists fp32 at the same figure).
    assert fastest_peak({"bfloat16": 459e12, "float32": 459e12}) == (459e12, "bfloat16")


def test_checked_peak_remeasures_then_raises_never_above_100() -> None:
    assert checked_peak(100.0, 200.0, "float32") == PeakChoice(200.0, "float32")
    # Beaten, and a re-probe finds a higher peak: that one is used.
    choice = checked_peak(250.0, 200.0, "float32", remeasure=lambda: (300.0, "float32"))
    assert (choice.flops_per_s, choice.raised_to_achieved) == (300.0, False) and "re-measured" in choice.note
    # Beaten even after re-probing: the achieved rate becomes the peak, and the note says so.
    calls = []
    choice = checked_peak(250.0, 200.0, "float32", remeasure=lambda: calls.append(1) or (210.0, "float32"))
    assert choice.flops_per_s == 250.0 and choice.raised_to_achieved and len(calls) == 1
    assert "achieved rate as the peak" in choice.note
    # Asked with nothing to re-measure (a worker that re-probed once already), it is raised the same way.
    assert checked_peak(250.0, 200.0, "bfloat16").flops_per_s == 250.0


def test_a_step_beating_a_published_peak_states_no_mfu() -> None:
    """A GPT block on a v5e chip printed "MFU 100.0%": the chip's published peak had been raised to
    a rate no step reaches. A published peak (re-measuring gives nothing) stays, and no MFU is stated."""
    choice = checked_peak(250.0, 200.0, "bfloat16", remeasure=lambda: None)
    assert (choice.flops_per_s, choice.raised_to_achieved) == (200.0, False)
    assert "published peak" in choice.note and "no MFU is stated" in choice.note
    assert mfu_text(mfu(250.0, 1.0, choice.flops_per_s)) == NO_MFU
    assert mfu_text(0.374) == "37.4%" and mfu_text(1.0) == "100.0%"


def test_utilisation_by_dtype_never_reports_above_100() -> None:
    assert utilisation_by_dtype(150e9, {"float32": 300e9, "bfloat16": 60e9}) == {"float32": 0.5, "bfloat16": None}


def test_baseline_and_medium_divide_by_the_same_peak(tmp_path, monkeypatch, fast_settings) -> None:
    # The host of the issue: bf16 far slower than fp32. `matmul medium` used to be divided by the
    # bf16 peak (159-177% MFU) while the baseline used fp32: the figures were not comparable.
    use_probe(monkeypatch, tmp_path, float32_flops_per_s=1e15, bfloat16_flops_per_s=1e3)
    baseline = tpu_tuner.profile(FIXTURES / "tiny_mlp_benchmark.py", device="cpu", settings=fast_settings)
    medium = tpu_tuner.profile(
        FIXTURES / "tiny_mlp_benchmark.py",
        device="cpu",
        settings=fast_settings,
        candidate=Candidate(matmul_precision="medium"),
    )
    for result in (baseline, medium):
        assert (result.peak_flops_per_s, result.peak_dtype) == (1e15, "float32")
        assert 0 < result.mfu <= 1 and result.mfu_convention == MFU_CONVENTION
        assert result.utilisation_by_dtype["bfloat16"] is None  # the step beats the bf16 probe
    assert "fastest dense dtype" in render_markdown(medium)


def test_a_step_that_beats_the_peak_reprobes_then_raises_it(tmp_path, monkeypatch, fast_settings) -> None:
    # A cached peak far too low (measured under load): the profile re-probes once; when the step
    # still beats it, the peak becomes the achieved rate, MFU is 100% and a warning says why.
    low = use_probe(monkeypatch, tmp_path, float32_flops_per_s=1e3, bfloat16_flops_per_s=1e3)
    probes = []
    monkeypatch.setattr(roofline, "measure", lambda device, sync: probes.append(1) or low)
    result = tpu_tuner.profile(FIXTURES / "tiny_mlp_benchmark.py", device="cpu", settings=fast_settings)
    assert len(probes) == 1
    assert result.mfu == pytest.approx(1.0) and result.peak_flops_per_s == pytest.approx(result.achieved_flops_per_s)
    assert result.device.peak.fastest()[0] == result.peak_flops_per_s  # trials start from the raised peak
    assert any("achieved rate as the peak" in w for w in result.warnings)
    assert result.verdict.compute_share <= 1


def _measurement(step: float, peak: float, dtype: str) -> Measurement:
    return Measurement(
        candidate={},
        step_median=step,
        step_p10=step,
        step_p90=step,
        samples=[step],
        first_call_seconds=0.0,
        warmup_seconds=0.0,
        compile_seconds=0.0,
        compiles={},
        model_flops_per_step=100e9,
        peak_flops_per_s=peak,
        peak_dtype=dtype,
        mfu=100e9 / step / peak,
        peak_memory_bytes=None,
        accuracy_errors={},
        compute_dtype=dtype,
    )


def test_tuning_report_compares_mfu_on_one_peak() -> None:
    from tpu_tuner.outputs.tuning_report import comparison_rows

    # The tuned trial beat the profile's peak and raised it: both columns use the raised peak,
    # so the tuned run reads higher (it is faster) and nothing reads above 100%.
    base = _measurement(1.0, 300e9, "float32")
    tuned = _measurement(0.25, 400e9, "float32")
    row = next(r for r in comparison_rows(base, tuned, 100) if r.startswith("| MFU"))
    assert "25.0% of 400 GFLOP/s" in row and "100.0% of 400 GFLOP/s" in row


def test_trials_use_the_profile_peak_and_reprobe_once_per_worker(tmp_path, monkeypatch, fast_settings) -> None:
    from dataclasses import replace

    from tpu_tuner.runner.jobs import WorkerState, run_measure
    from tpu_tuner.runner.requests import MeasureRequest

    low = use_probe(monkeypatch, tmp_path, float32_flops_per_s=1e3, bfloat16_flops_per_s=1e3)
    probes = []
    monkeypatch.setattr(roofline, "measure", lambda device, sync: probes.append(1) or low)
    state = WorkerState(str(FIXTURES / "tiny_mlp_benchmark.py"), "cpu")
    options = MeasureRequest(
        settings=fast_settings, model_flops_per_step=1e6, peak_flops_per_s={"float32": 1e3, "bfloat16": 2e3}
    )
    medium = run_measure(state, replace(options, candidate=Candidate(matmul_precision="medium").to_dict()))
    baseline = run_measure(state, replace(options, candidate=Candidate().to_dict()))
    assert len(probes) == 1  # the first trial that beat the peak re-probed; the worker kept the result
    for m in (medium, baseline):
        assert m.peak_dtype == "bfloat16" and m.mfu <= 1.0 + 1e-12  # one peak for every setting
    assert "achieved rate as the peak" in medium.warnings[-1]


def test_a_tuning_result_reports_every_trial_on_the_runs_one_peak(tmp_path) -> None:
    """Trials measured before a worker raised the peak used the lower one: the result, its trials
    table (repeats included) and its baseline / tuned figures all divide by the highest peak."""
    import types

    import optuna

    from tpu_tuner.tuning.options.tune_options import RunnerOptions, TuneOptions, default_trial_settings
    from tpu_tuner.tuning.run.tuning_result import TuningResult
    from tpu_tuner.tuning.search import trial_attrs
    from tpu_tuner.tuning.search.search_space import SearchSpace
    from tpu_tuner.tuning.verify.verification import Verification

    study = optuna.create_study()
    for m in (_measurement(1.0, 400e9, "bfloat16"), _measurement(0.25, 900e9, "bfloat16")):
        trial = study.ask()
        study.tell(trial, trial_attrs.record_measurement(trial, m, 100, 0.01))
    repeat = study.ask()
    trial_attrs.copy_attrs(study.trials[1], repeat, 0.01)
    study.tell(repeat, study.trials[1].value)
    profile = types.SimpleNamespace(peak_flops_per_s=400e9, peak_dtype="bfloat16")
    result = TuningResult(
        run_dir=tmp_path,
        study=study,
        space=SearchSpace.load("default", "cpu"),
        profile=profile,
        findings={},
        verification=Verification(0, 1, Candidate(), True, None),
        options=TuneOptions(runner=RunnerOptions(trial_settings=default_trial_settings())),  # as a run resolves them
    )
    assert result.peak == (900e9, "bfloat16")
    assert result.baseline.mfu == pytest.approx(100e9 / 1.0 / 900e9)  # 11.1%, not the 25% it stored
    assert result.chosen.mfu == pytest.approx(100e9 / 0.25 / 900e9)
    frame = result.trials_dataframe()
    assert list(frame["mfu"].round(4)) == [0.1111, 0.4444, 0.4444]
