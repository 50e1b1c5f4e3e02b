"""benchmarks/chip/tpu_levers.py: the lever table from the chip's JSON (the figures docs/knobs.md
states), and a whole run on the CPU with a tiny model (slow: each build compiles with inductor)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.common import benchmark_script

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks" / "chip"
FIXTURES = Path(__file__).parent / "fixtures"


def _levers():
    return benchmark_script(BENCHMARKS / "tpu_levers.py")


def test_the_chip_table_states_the_figures_the_docs_quote() -> None:
    table = _levers().table(json.loads((BENCHMARKS / "tpu_levers_llama_v5e.json").read_text()))
    assert "| bf16 parameters | 99.4 ms | 48.5% | 2.251x (1.903-2.661) | 13.90 GiB | 41.0 s |" in table
    assert "| reference | 223.8 ms | 21.5% | 1 (itself) | 15.74 GiB | 36.1 s |" in table
    assert "| optimizer compiled | failed: RuntimeError: execute(): failed to prepare compiled mode" in table
    assert "torch-tpu': '0.2.0'" in table and "'libtpu': '0.0.52'" in table


@pytest.mark.slow  # two builds a round, each compiled with inductor on CPU
def test_a_run_on_the_cpu_pairs_each_lever_with_the_reference_by_round(tmp_path: Path, capsys) -> None:
    out = tmp_path / "levers.json"
    levers = _levers()
    status = levers.main(
        ["--device", "cpu", "--model", str(FIXTURES / "tiny_gpt.py"), "--batch-size", "2", "--seq", "32"]
        + ["--rounds", "2", "--steps", "3", "--only", "reference", "bf16 parameters", "--out", str(out)]
    )
    assert status == 0
    result = json.loads(out.read_text())
    assert [len(result["settings"][name]["samples"]) for name in ("reference", "bf16 parameters")] == [2, 2]
    assert result["model_flops_per_step"] > 0
    assert "| bf16 parameters |" in capsys.readouterr().out


def test_bad_sizes_exit_2_with_one_line(capsys) -> None:
    assert _levers().main(["--rounds", "0"]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0


def test_the_readme_example_and_cnn_tables_state_the_figures_the_docs_quote() -> None:
    gpt = _levers().table(json.loads((BENCHMARKS / "tpu_levers_gpt_v5e_3rounds.json").read_text()))
    assert "| loss compiled | 13.2 ms | 1.1% | 1.074x (1.037-1.112) |" in gpt
    assert "| splash | failed: BackendCompilerFailed" in gpt
    cnn = _levers().table(json.loads((BENCHMARKS / "tpu_levers_cnn_v5e_3rounds.json").read_text()))
    assert "| bf16 parameters | 0.8 ms | 9.1% | 0.517x (0.473-0.565) |" in cnn


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["param_dtype"], "'param_dtype' is not KNOB=VALUE"),
        (["nosuch=1"], "unknown candidate settings: ['nosuch']"),
        (["param_dtype=bf16"], "param_dtype must be one of default, bfloat16, not 'bf16'"),
    ],
)
def test_a_bad_base_exits_2_with_one_line_naming_it(words: list[str], message: str, capsys) -> None:
    assert _levers().main(["--device", "cpu", "--base", *words]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


def test_the_base_reaches_every_setting_but_the_baseline() -> None:
    levers = _levers()
    base = {"execution": "tpu", "autocast": "bfloat16", **levers.base_settings(["param_dtype=bfloat16"])}
    splash = levers.candidate_of("splash", SimpleNamespace(kind="tpu"), base)
    assert splash["param_dtype"] == "bfloat16" and splash["attention_kernel"] == "splash"
    assert levers.candidate_of("baseline", SimpleNamespace(kind="tpu"), base)["param_dtype"] == "default"


def test_the_splash_tables_state_the_figures_the_docs_quote() -> None:
    """The sixth chip session: splash runs (its output and gradients copied to a plain layout)."""
    decoder = _levers().table(json.loads((BENCHMARKS / "tpu_levers_335m_v5e_splash.json").read_text()))
    assert "| reference | 601.2 ms | 30.6% | 1 (itself) |" in decoder
    assert "| splash | 491.1 ms | 37.4% | 1.219x (0.411-3.618) |" in decoder
    gpt = _levers().table(json.loads((BENCHMARKS / "tpu_levers_gpt_v5e_splash.json").read_text()))
    assert "| splash | 13.7 ms | 1.0% | 1.049x (1.009-1.091) |" in gpt
    every_2nd = _levers().table(json.loads((BENCHMARKS / "tpu_levers_335m_v5e_every2nd.json").read_text()))
    assert "| splash, no checkpointing | failed: RuntimeError: failed to compile MLIR module" in every_2nd


def test_the_whole_step_and_optimizer_tables_state_the_figures_the_docs_quote() -> None:
    gpt = _levers().table(json.loads((BENCHMARKS / "tpu_levers_gpt_v5e_whole_step.json").read_text()))
    assert "| whole step traced | 6.1 ms | 2.3% | 2.307x (2.063-2.581) | 0.26 GiB | 25.1 s |" in gpt
    decoder = _levers().table(json.loads((BENCHMARKS / "tpu_levers_335m_v5e_optimizer.json").read_text()))
    assert "| reference | 477.0 ms | 38.5% | 1 (itself) | 15.75 GiB | 46.5 s |" in decoder
    assert "| optimizer compiled | 637.0 ms | 28.9% | 0.749x (0.723-0.776) | 15.75 GiB | 85.2 s |" in decoder


def test_the_deferred_optimizer_runs_each_update_inside_the_devices_defer_and_fuse_mode() -> None:
    import contextlib
    import sys

    sys.path.insert(0, str(BENCHMARKS))
    try:
        settings = benchmark_script(BENCHMARKS / "tpu_lever_settings.py")
    finally:
        sys.path.remove(str(BENCHMARKS))
    modes: list[str | None] = []
    inside: list[bool] = []

    @contextlib.contextmanager
    def eager_mode(mode):
        modes.append(mode)
        yield

    def update():
        inside.append(len(modes) == 1)

    step = SimpleNamespace(optimizer=SimpleNamespace(step=update))
    settings.defer_optimizer(step, SimpleNamespace(eager_mode=eager_mode))
    step.optimizer.step()
    assert modes == ["defer_and_fuse"] and inside == [True]
    assert settings.SETTINGS["optimizer deferred"].patch is settings.defer_optimizer
