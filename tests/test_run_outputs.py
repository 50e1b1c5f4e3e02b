"""Run folders belong to the library: one module names and writes every file, the CLI and the
Python API leave the same files, the collector reads the same names, the result modules do not
import each other in a circle, and `TuningResult.load(run_dir)` gives back a finished run."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from conftest import EXAMPLES, FIXTURES

from tpu_tuner.bucketing.options import BucketChoice, BucketMeasurement
from tpu_tuner.core import run_folder
from tpu_tuner.core.errors import UserInputError
from tpu_tuner.tuning.options.tune_options import ObjectiveOptions, OutputOptions, RunnerOptions, SearchOptions

PACKAGE = Path(__file__).parent.parent / "tpu_tuner"


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module, under TYPE_CHECKING) for every import statement of a file, at any depth."""
    tree = ast.parse(path.read_text())
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            guarded.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, id(node) in guarded))
        elif isinstance(node, ast.Import):
            found += [(alias.name, id(node) in guarded) for alias in node.names]
    return found


def test_tuning_result_and_reports_import_in_one_direction() -> None:
    # The result never reaches for the reports (not even inside a function) ...
    result_imports = [m for m, _ in _imports(PACKAGE / "tuning" / "run" / "tuning_result.py")]
    assert not [m for m in result_imports if m.startswith("tpu_tuner.outputs")], result_imports
    # ... and the reports know the result only as a type.
    reports = sorted((PACKAGE / "outputs").glob("*.py"))
    assert {"tuning_report.py", "tuning_plots.py", "write.py"} <= {p.name for p in reports}
    for report in reports:
        runtime = [m for m, typing_only in _imports(report) if m.startswith("tpu_tuner.tuning") and not typing_only]
        assert not runtime, (report.name, runtime)
    # Each imports on its own in a fresh interpreter (started together: each waits on its imports).
    modules = (
        "tpu_tuner.tuning.run.tuning_result",
        "tpu_tuner.outputs.tuning_report",
        "tpu_tuner.outputs.tuning_plots",
        "tpu_tuner.outputs.write",
        "tpu_tuner.dashboard.collect",
    )
    started = {
        module: subprocess.Popen([sys.executable, "-c", f"import {module}"], stderr=subprocess.PIPE, text=True)
        for module in modules
    }
    for module, process in started.items():
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, (module, err[-2000:])


def _run_file_names() -> set[str]:
    return {
        value for name, value in vars(run_folder).items() if name.isupper() and isinstance(value, str) and "." in value
    }


def test_no_module_but_run_folder_spells_a_run_file_name() -> None:
    names = _run_file_names()
    assert {
        "profile.json",
        "run.json",
        "result.json",
        "tuned_config.toml",
        "trials.csv",
        "plan.json",
        "buckets.json",
        "compiler.log",
        "predicted_mfu.png",
    } <= names
    spelled = {}
    paths = [
        *(PACKAGE / "cli").glob("*.py"),
        PACKAGE / "api.py",
        PACKAGE / "tuning" / "run" / "tuning_result.py",
        *(PACKAGE / "dashboard").glob("*.py"),
        *(PACKAGE / "outputs").glob("*.py"),
    ]
    assert (PACKAGE / "outputs" / "write.py") in paths and (PACKAGE / "dashboard" / "collect.py") in paths
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                spelled.setdefault(path.name, []).append(node.value)
    assert not spelled, spelled


def _fast_agent(tmp_path: Path) -> Path:
    agent = tmp_path / "fast.toml"
    agent.write_text(
        "[warmup]\nmin_steps = 2\nmax_steps = 10\n[timing]\nmin_steps = 10\nmin_seconds = 0\n"
        "max_steps = 50\n[operators]\nprofiled_steps = 1\ntop = 5\n"
    )
    return agent


def test_profile_cli_and_api_write_the_same_folder(tmp_path, capsys) -> None:
    """The `profile` command (its JSON, its report and the MFU it prints) and the API's profile."""
    from tpu_tuner import Profile, ProfilerSettings, profile, save_profile
    from tpu_tuner.cli import main

    agent = _fast_agent(tmp_path)
    assert (
        main(
            [
                "-q",
                "profile",
                str(FIXTURES / "tiny_gpt.py"),
                "--out",
                str(tmp_path / "cli"),
                "--agent",
                str(agent),
                "--seq-len",
                "16",
            ]
        )
        == 0
    )
    measured = profile(FIXTURES / "tiny_gpt.py", seq_len=16, settings=ProfilerSettings.load(agent))
    api_dir = save_profile(measured, tmp_path / "api")
    (cli_dir,) = (tmp_path / "cli").iterdir()
    assert api_dir.parent == tmp_path / "api" and api_dir.name.startswith("tiny_gpt-")
    assert sorted(p.name for p in api_dir.iterdir()) == sorted([run_folder.PROFILE_JSON, run_folder.PROFILE_MD])
    # The command profiles in a worker, whose own output is kept beside (the API profiles in-process).
    assert sorted(p.name for p in cli_dir.iterdir()) == sorted(
        [run_folder.PROFILE_JSON, run_folder.PROFILE_MD, run_folder.WORKERS_LOG]
    )
    # profile.json reads back into the same Profile, nested figures and all.
    loaded = Profile.from_json((api_dir / run_folder.PROFILE_JSON).read_text())
    assert loaded == measured
    from_cli = json.loads((cli_dir / run_folder.PROFILE_JSON).read_text())
    assert cli_dir.name.startswith("tiny_gpt-") and from_cli["workload"]["seq_len"] == 16
    assert len(from_cli["timing"]["samples"]) >= 10
    report = (cli_dir / run_folder.PROFILE_MD).read_text()
    assert "MFU" in report and "Top operators" in report and "attention convention" in report
    printed = capsys.readouterr().out
    assert f"{from_cli['mfu']:.1%}" in printed and "verdict" in printed  # the table shows the JSON's MFU


def test_the_profile_command_s_worker_is_a_library_call() -> None:
    from tpu_tuner.core.errors import WorkloadError
    from tpu_tuner.runner.isolated_profile import profile_in_worker

    # The model file crashes at import in the worker; this process gets a one-line error.
    with pytest.raises(WorkloadError) as caught:
        profile_in_worker(FIXTURES / "exit_at_import.py")
    assert "\n" not in str(caught.value) and "exit_at_import.py" in str(caught.value)


@pytest.mark.slow  # a whole run end to end: .ci/run's full pass
@pytest.mark.timed  # measured beside another test it took 109 s (18 s alone)
def test_buckets_cli_and_api_write_the_same_folder(tmp_path, capsys) -> None:
    from tpu_tuner import BucketOptions, plan_buckets, save_buckets
    from tpu_tuner.cli import main

    assert (
        main(
            [
                "-q",
                "buckets",
                str(FIXTURES / "tiny_encoder.py"),
                "--compile-backend",
                "aot_eager",
                "--steps",
                "1000",
                "--max-buckets",
                "3",
                "--out",
                str(tmp_path / "cli"),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    result = plan_buckets(
        FIXTURES / "tiny_encoder.py",
        BucketOptions(
            measure=BucketMeasurement(compile_backend="aot_eager"),
            choice=BucketChoice(planned_steps=1000, max_buckets=3),
        ),
    )
    api_dir = save_buckets(result, tmp_path / "api", FIXTURES / "tiny_encoder.py")
    (cli_dir,) = (tmp_path / "cli").iterdir()
    expected = sorted(
        [
            run_folder.BUCKETS_JSON,
            run_folder.BUCKETS_MD,
            run_folder.LENGTHS_PNG,
            run_folder.STRATEGIES_PNG,
            run_folder.BUCKET_CONFIG,
        ]
    )
    assert sorted(p.name for p in api_dir.iterdir()) == expected
    # The command measures in a worker, whose output it keeps in the folder (the API runs in-process).
    assert sorted(p.name for p in cli_dir.iterdir()) == sorted([*expected, run_folder.WORKERS_LOG])
    assert f"wrote {cli_dir}/ (" in printed


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("torchax") is None or importlib.util.find_spec("libtpu") is None,
    reason="the planner extra is not installed: pip install -e '.[plan]'",
)
def test_plan_cli_and_api_write_the_same_folder(tmp_path) -> None:
    # In a fresh interpreter: importing torchax registers a device with torch that breaks
    # torch.compile later in pytest's process (tests/test_planner_compile.py).
    code = f"""
        from pathlib import Path
        from tpu_tuner import PlanOptions, plan_to_folder
        from tpu_tuner.cli import main
        from tpu_tuner.planner.plans.plan_options import PlanEnumeration, PlanStep, PlanTarget
        from tpu_tuner.model.meshes.layouts import Layout
        args = ["{EXAMPLES / "llama.py"}", "--preset", "tiny", "--topology", "v5e-4", "--global-batch", "8",
                "--seq", "128", "--layout", "1x4x1"]
        assert main(["-q", "plan", *args, "--out", "{tmp_path / "cli"}"]) == 0
        options = PlanOptions(PlanTarget("v5e-4"), step=PlanStep(global_batch=8, seq_len=128, preset="tiny"),
                              enumeration=PlanEnumeration(layouts=[Layout(1, 4, 1)]))
        run_dir, result = plan_to_folder("{EXAMPLES / "llama.py"}", options, "{tmp_path / "api"}")
        print(run_dir)
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (cli_dir,) = (tmp_path / "cli").iterdir()
    api_dir = Path(done.stdout.strip().splitlines()[-1])
    assert cli_dir.name.startswith("llama_tiny-plan-v5e-4-") and api_dir.name.startswith("llama_tiny-plan-v5e-4-")
    expected = sorted(
        [
            run_folder.PLAN_JSON,
            run_folder.PLAN_MD,
            run_folder.PLAN_PNG,
            run_folder.SHARDING_CONFIG,
            run_folder.COMPILER_LOG,
        ]
    )
    assert sorted(p.name for p in cli_dir.iterdir()) == sorted(p.name for p in api_dir.iterdir()) == expected


# --- TuningResult.load -------------------------------------------------------------------------


def _tuned(tmp_path: Path):
    from tpu_tuner import TuneOptions, tune
    from tpu_tuner.profiling import ProfilerSettings

    fast = ProfilerSettings(
        warmup_min_steps=1,
        warmup_max_steps=5,
        timing_min_steps=10,
        timing_min_seconds=0.0,
        timing_max_steps=20,
        profiled_steps=1,
        top_operators=3,
    )
    options = TuneOptions(
        search=SearchOptions(
            space=FIXTURES / "eager_precision_space.toml",
            agents=("precision",),
            trials=6,
            sampler="grid",
            time_budget_s=None,
        ),
        objective=ObjectiveOptions(verify_rounds=4),
        outputs=OutputOptions(out=tmp_path / "runs"),
        runner=RunnerOptions(trial_timeout_s=60.0, trial_settings=fast),
    )
    return tune(FIXTURES / "synthetic_speed.py", options)


# Slow: a whole tuning run. Not timed: it compares what loads back with the live result, whatever the
# verification measured; no clock (time_budget_s=None), so the grid's 6 trials are measured under any load.
@pytest.mark.slow
def test_a_finished_run_loads_back_as_the_live_result(tmp_path) -> None:
    from tpu_tuner import TuningResult

    live = _tuned(tmp_path)
    assert (live.run_dir / run_folder.RESULT_JSON).is_file()
    # Moved elsewhere: the study comes from the study.db in the folder, not the stored path.
    moved = shutil.move(str(live.run_dir), str(tmp_path / "moved"))
    loaded = TuningResult.load(moved)
    assert loaded.run_dir == Path(moved)
    assert loaded.verification.chosen == live.verification.chosen
    assert loaded.verification.speedup == live.verification.speedup
    assert loaded.verification.contributions == live.verification.contributions
    assert loaded.verification.message == live.verification.message
    assert loaded.findings == live.findings and loaded.space == live.space
    assert loaded.profile == live.profile
    assert loaded.options.objective.planned_steps == live.options.objective.planned_steps
    assert loaded.options.runner.trial_settings == live.options.runner.trial_settings
    assert loaded.peak == live.peak
    for name in ("baseline", "best", "chosen"):
        assert getattr(loaded, name) == getattr(live, name), name
        assert getattr(loaded, name).mfu == getattr(live, name).mfu
    pd.testing.assert_frame_equal(loaded.trials_dataframe(), live.trials_dataframe())
    assert loaded.best_config.candidate == live.best_config.candidate
    assert loaded.best_config.provenance["created"] == live.best_config.provenance["created"]
    assert loaded.best_config.provenance["verification"] == live.best_config.provenance["verification"]


def _one_line_error_naming(folder: Path) -> str:
    from tpu_tuner import TuningResult

    with pytest.raises(UserInputError) as caught:
        TuningResult.load(folder)
    message = str(caught.value)
    assert "\n" not in message and str(folder) in message and "not a finished tuning run" in message
    return message


def test_a_folder_that_is_no_finished_run_is_refused_in_one_line(tmp_path) -> None:
    assert "no such folder" in _one_line_error_naming(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_folder.RUN_JSON in _one_line_error_naming(empty)
    profile_dir = tmp_path / "tiny-20261130-000000"
    profile_dir.mkdir()
    (profile_dir / run_folder.PROFILE_JSON).write_text("{}")
    _one_line_error_naming(profile_dir)
    running = tmp_path / "run-tune-20261130-000000"
    running.mkdir()
    (running / run_folder.RUN_JSON).write_text(
        json.dumps(
            {"storage": "sqlite:///x.db", "study_name": "x", "status": "failed", "reason": "interrupted (Ctrl-C)"}
        )
    )
    assert "'failed' (interrupted (Ctrl-C))" in _one_line_error_naming(running)
    (running / run_folder.RUN_JSON).write_text(
        json.dumps({"storage": "sqlite:///x.db", "study_name": "x", "status": "done"})
    )
    assert run_folder.RESULT_JSON in _one_line_error_naming(running)
