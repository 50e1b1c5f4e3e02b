"""`tpu-tune MODEL.py` and `tpu-tune apply` end to end on a tiny model with a small budget."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import FIXTURES, use_probe

from tpu_tuner.cli import main
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.tuned_config import TunedConfig


def test_tune_is_the_default_command(tmp_path, capsys, monkeypatch, tmp_path_factory) -> None:
    # A host where "medium" runs bf16 matmuls: three settings of the space are worth measuring
    # (on an fp32-only host the precision agent rejects "medium" as it rejects "high").
    use_probe(monkeypatch, tmp_path_factory.mktemp("cache"), medium_relative_error=2.5e-3)
    status = main(
        [
            "-q",
            str(FIXTURES / "tiny_mlp_benchmark.py"),
            "--trials",
            "3",
            "--verify-rounds",
            "4",
            "--space",
            "precision",
            "--out",
            str(tmp_path),
        ]
    )
    assert status == 0
    (run_dir,) = tmp_path.iterdir()
    assert run_dir.name.startswith("tiny_mlp_benchmark-tune-")
    printed = capsys.readouterr().out
    assert "| budget 1/3 |" in printed and "[trial 0 |" in printed and "baseline" in printed and "speedup" in printed
    assert str(run_dir) in printed
    assert (run_dir / "workers.log").is_file()  # the workers' own output, off the terminal
    frame = pd.read_csv(run_dir / "trials.csv")
    measured = frame[frame["repeat_of"].isna() & frame["rejected_by"].isna()]
    assert len(measured) == 3  # the budget counts measured settings
    config = TunedConfig.load(run_dir / "tuned_config.toml")
    assert config.provenance["workload"]["name"] == "tiny_mlp_benchmark"

    status = main(["apply", str(run_dir / "tuned_config.toml")])
    assert status == 0
    assert f'torch.set_float32_matmul_precision("{config.candidate["matmul_precision"]}")' in capsys.readouterr().out


def test_apply_prints_torchtpu_environment(tmp_path, capsys) -> None:
    path = TunedConfig(Candidate(execution="eager:defer_and_fuse", matmul_precision="medium"), "tpu").save(
        tmp_path / "c.toml"
    )
    assert main(["apply", str(path)]) == 0
    out = capsys.readouterr().out
    assert "export TORCH_TPU_DEFER_AND_FUSE=1" in out and "before the process imports torch" in out


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--trials", "0"], "--trials must be at least 1"),
        (["--tolerance", "-1"], "--tolerance must be positive"),
        (["--space", "nope"], "no built-in search spaces definition 'nope'"),
        (["--resume", "/nonexistent/run"], "not a tuning run folder"),
        (["--nproc", "0"], "--nproc must be at least 1"),
        (["--plan", "/nonexistent/plan"], "--plan seeds sharding layouts, which need several ranks: give --nproc N"),
        (["--nproc", "2", "--plan", "/nonexistent/plan"], "not a plan folder (no plan.json"),
    ],
)
def test_bad_tune_input_is_one_line_and_status_2(tmp_path, capsys, args, problem) -> None:
    status = main(["-q", str(FIXTURES / "tiny_mlp_benchmark.py"), "--out", str(tmp_path), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and problem in err[0]
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # rejected before any run folder exists


def test_bad_model_file_for_tune(tmp_path, capsys) -> None:
    assert main(["-q", str(FIXTURES / "syntax_error.py"), "--out", str(tmp_path)]) == 2
    assert "syntax error" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # no run folder for a file that never loaded


def test_bad_config_for_apply(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("format_version = 1\n[settings]\nmatmul_precision = 'fastest'\n")
    assert main(["apply", str(bad)]) == 2
    assert "bad [settings]" in capsys.readouterr().err


# Slow: each command profiles the baseline before it refuses; no clock (--time-budget none), so load
# cannot change what it says: it runs two at a time in .ci/run's full pass.
@pytest.mark.slow
def test_nproc_needs_a_batch_that_splits_over_the_ranks_and_a_space_with_layouts(tmp_path, capsys) -> None:
    llama = FIXTURES / "tiny_llama.py"  # batch 4
    assert main(["-q", str(llama), "--nproc", "3", "--time-budget", "none", "--out", str(tmp_path)]) == 2
    assert "--nproc 3: the batch of 4 does not split over 3 ranks" in capsys.readouterr().err
    assert (
        main(
            [
                "-q",
                str(llama),
                "--nproc",
                "2",
                "--time-budget",
                "none",
                "--space",
                str(FIXTURES / "eager_precision_space.toml"),
                "--out",
                str(tmp_path),
            ]
        )
        == 2
    )
    assert "has no layout parameter" in capsys.readouterr().err


def test_the_last_lines_suggest_only_a_dashboard_that_is_installed(tmp_path, monkeypatch) -> None:
    """Issue 55: the run's last line suggested optuna-dashboard, which no extra installs."""
    import importlib.util

    from tpu_tuner.cli.common import dashboard_lines

    run_dir = tmp_path / "results" / "m-tune-1"
    storage = f"sqlite:///{run_dir}/study.db"
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "optuna_dashboard" else real(name))
    assert dashboard_lines(run_dir, storage) == [f"dashboard tpu-tune dashboard {tmp_path / 'results'}"]
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: object() if name == "optuna_dashboard" else real(name)
    )
    assert dashboard_lines(run_dir, storage)[1] == f"          optuna-dashboard {storage}"
