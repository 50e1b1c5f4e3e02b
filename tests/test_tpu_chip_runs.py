"""benchmarks/chip/tpu_chip_runs.py's summary of a run folder, on the trials.csv of the Llama-class
forward pass the v5e chip ran on 2026-12-07 (tests/fixtures/chip_run): the cost figures and one
line a measured trial, with its setting as the run's space searched it."""

from __future__ import annotations

from pathlib import Path

from helpers.common import benchmark_script

RUNS = Path(__file__).resolve().parent.parent / "benchmarks" / "chip" / "tpu_chip_runs.py"
RUN = Path(__file__).parent / "fixtures" / "chip_run"


def _runs():
    return benchmark_script(RUNS)


def test_the_summary_names_each_trials_setting_step_and_compile() -> None:
    costs = _runs()._trial_costs(RUN)
    assert costs["settings_measured"] == 4 and costs["failed"] == 0
    assert costs["compile_s_median"] == 7.7
    tuned = costs["trials"][2]
    assert tuned["step_ms"] == 87.38 and tuned["compile_s"] == 16.4 and tuned["outcome"] == "measured"
    assert "execution=tpu" in tuned["setting"] and "param_dtype=bfloat16" in tuned["setting"]
    assert costs["trials"][0]["setting"].startswith("execution=eager:strict")
