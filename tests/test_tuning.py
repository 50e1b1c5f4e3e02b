"""The tuning loop: finds the known best, rejects accuracy violations, survives every failure
kind, resumes without repeating trials, and writes a config that round-trips."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import pytest
from conftest import FIXTURES, use_probe

from tpu_tuner import TuneOptions, tune
from tpu_tuner.profiling import ProfilerSettings
from tpu_tuner.studies import records
from tpu_tuner.tuning.options.tune_options import (
    ObjectiveOptions,
    OutputOptions,
    RunnerOptions,
    SearchOptions,
    StoreOptions,
)

SPACE = FIXTURES / "eager_precision_space.toml"
FAST = ProfilerSettings(
    warmup_min_steps=1,
    warmup_max_steps=5,
    timing_min_steps=10,
    timing_min_seconds=0.0,
    timing_max_steps=20,
    profiled_steps=1,
    top_operators=3,
)


def _options(
    tmp_path: Path,
    *,
    trial_timeout_s: float = 60.0,
    resume: Path | None = None,
    **search: Any,
) -> TuneOptions:
    return TuneOptions(
        search=SearchOptions(**{"space": SPACE, "agents": (), "trials": 6, "sampler": "grid", **search}),
        objective=ObjectiveOptions(verify_rounds=6),
        runner=RunnerOptions(trial_timeout_s=trial_timeout_s, trial_settings=FAST),
        store=StoreOptions(resume=resume),
        outputs=OutputOptions(out=tmp_path),
    )


def _by_params(frame: pd.DataFrame) -> dict[tuple[str, str], pd.Series]:
    return {(row["matmul_precision"], row["autocast"]): row for _, row in frame.iterrows()}


@pytest.fixture(scope="module")
def grid_run(tmp_path_factory: pytest.TempPathFactory):
    """One grid run over the synthetic space, read by the tests below (none changes it)."""
    return tune(FIXTURES / "synthetic_speed.py", _options(tmp_path_factory.mktemp("grid-run")))


def test_finds_the_known_best_and_rejects_the_inaccurate_one(grid_run) -> None:
    result = grid_run
    rows = _by_params(result.trials_dataframe())
    assert len(rows) == 6  # the grid covered the space exactly once
    # "high" is faster than the baseline but changes the output by 50%: infeasible, never chosen.
    high = rows[("high", "none")]
    assert high["failure_kind"] == "accuracy" and not high["feasible"]
    assert high["accuracy_error"] == pytest.approx(0.5, rel=1e-3)
    assert result.verification.chosen["matmul_precision"] == "medium"
    assert result.verification.chosen["autocast"] == "none"
    # 12 ms -> 3 ms of sleep: the interleaved verification sees a large, significant win.
    assert result.verification.speedup.significant and result.verification.speedup.speedup > 2
    assert result.best_config.candidate == result.verification.chosen


@pytest.mark.slow  # a whole search on a synthetic step whose speeds are timed
@pytest.mark.timed  # TPE's pick, medium matmuls, is the fastest by measured step times
def test_tpe_reaches_the_best_within_budget(tmp_path, monkeypatch) -> None:
    # A host where "medium" really runs matmuls as bf16 (the precision agent skips it elsewhere).
    use_probe(monkeypatch, tmp_path / "cache", medium_relative_error=2.5e-3)
    events = []
    result = tune(
        FIXTURES / "synthetic_speed.py",
        _options(tmp_path, sampler="tpe", trials=8, agents=("precision",)),
        progress=events.append,
    )
    assert result.verification.chosen["matmul_precision"] == "medium"
    frame = result.trials_dataframe()
    # The precision agent rejects "high" on CPU without measuring it (no TF32 there); other
    # pruned trials are the slow ones stopped early (tuning/search/pruning.py).
    rejected = frame[frame["rejected_by"].notna()]
    assert set(rejected["matmul_precision"]) <= {"high"}
    assert all("identical to 'highest'" in r for r in rejected["rejected_by"])
    # Each rejection's event carries the agent's reason, which the CLI counts (cli/tune_progress.py).
    assert sorted(e.rejected_by for e in events if e.rejected_by) == sorted(rejected["rejected_by"])


@pytest.mark.slow  # a whole run end to end: .ci/run's full pass
@pytest.mark.timed  # a 20 s trial timeout: a healthy trial on a loaded host could pass it
def test_every_failure_kind_is_survived_and_recorded(tmp_path) -> None:
    result = tune(FIXTURES / "failing.py", _options(tmp_path, trial_timeout_s=20.0))
    rows = _by_params(result.trials_dataframe())
    assert len(rows) == 6
    assert rows[("highest", "none")]["state"] == "COMPLETE"
    expected = {
        ("high", "none"): ("crash", "SIGSEGV"),
        ("medium", "none"): ("timeout", "no result after 20 s"),
        ("highest", "bfloat16"): ("error", "ValueError: this setting is not supported"),
        ("high", "bfloat16"): ("oom", "allocate"),
        ("medium", "bfloat16"): ("oom", "SIGKILL"),
    }
    for params, (kind, text) in expected.items():
        row = rows[params]
        # Told as pruned with a violated constraint, so that TPE learns from it (tuning/search/trials.py).
        assert row["state"] == "PRUNED", params
        assert row["failure_kind"] == kind, (params, row["failure_kind"], row["failure_message"])
        assert text in row["failure_message"], (params, row["failure_message"])
    # Nothing beat the baseline, so the baseline is the recommendation.
    assert result.verification.chosen["matmul_precision"] == "highest"
    assert not result.verification.chosen_is_best
    report = (result.run_dir / "report.md").read_text()
    assert "**timeout**" in report and "**crash**" in report and "**oom**" in report


@pytest.mark.slow  # two runs end to end, no clock (time_budget_s=None): .ci/run's full pass
def test_resume_continues_without_losing_or_repeating(tmp_path) -> None:
    # No pruning: the test counts every setting of the grid measured to the end.
    first = tune(FIXTURES / "synthetic_speed.py", _options(tmp_path, trials=3, prune=False, time_budget_s=None))
    before = {t.number: (t.params, t.value, t.state) for t in first.study.trials}
    # Simulate a run killed mid-trial: a trial left RUNNING in the storage.
    storage = json.loads((first.run_dir / "run.json").read_text())
    study = optuna.load_study(study_name=storage["study_name"], storage=storage["storage"])
    orphan = study.ask(
        {
            "matmul_precision": optuna.distributions.CategoricalDistribution(["highest", "high", "medium"]),
            "autocast": optuna.distributions.CategoricalDistribution(["none", "bfloat16"]),
        }
    )
    resumed = tune(
        FIXTURES / "synthetic_speed.py",
        _options(tmp_path, trials=6, resume=first.run_dir, prune=False, time_budget_s=None),
    )
    trials = resumed.study.trials
    assert resumed.run_dir == first.run_dir
    for number, (params, value, state) in before.items():  # completed trials kept as they were
        assert (trials[number].params, trials[number].value, trials[number].state) == (params, value, state)
    assert trials[orphan.number].state == optuna.trial.TrialState.FAIL
    assert records.attrs(trials[orphan.number])["failure_kind"] == "interrupted"
    measured = [tuple(sorted(t.params.items())) for t in trials if records.attrs(t).get("measurement")]
    assert len(measured) == len(set(measured))  # no setting measured twice
    assert len(set(measured)) == 6  # the resumed run finished the grid


def test_outputs_and_config_round_trip(grid_run) -> None:
    import torch

    from tpu_tuner.knobs.tuned_config import TunedConfig, apply

    result = grid_run
    run_dir = result.run_dir
    for name in (
        "tuned_config.toml",
        "report.md",
        "trials.csv",
        "optimisation_history.png",
        "mfu_per_trial.png",
        "speed_vs_accuracy.png",
        "study.db",
    ):
        assert (run_dir / name).is_file() and (run_dir / name).stat().st_size > 0, name
    assert len(pd.read_csv(run_dir / "trials.csv")) == len(result.study.trials)
    loaded = TunedConfig.load(run_dir / "tuned_config.toml")
    assert loaded.candidate == result.verification.chosen
    assert loaded.provenance["verification"]["significant"] is True
    assert loaded.provenance["tuned"]["accuracy_error"] <= result.options.objective.tolerance
    assert loaded.provenance["versions"]["torch"] == torch.__version__
    # Applying it reproduces the configuration in this process.
    model = torch.nn.Linear(8, 8)
    previous = torch.get_float32_matmul_precision()
    try:
        applied_model, autocast = apply(model, run_dir / "tuned_config.toml")
        assert torch.get_float32_matmul_precision() == "medium"
        assert applied_model is model  # eager: nothing to compile
        with autocast():
            assert not torch.is_autocast_enabled("cpu")
    finally:
        torch.set_float32_matmul_precision(previous)
