"""benchmarks/chip/tpu_mfu_beside_jax.py without a chip: its refusal, its dry run, the order and
environments of its chip processes (subprocess.run replaced by one that writes the files each part
leaves), and the table's MFU and ratio on one FLOP count and one peak.

The predicted figures below are the planner's own for the default shape (a dry run on a 2-vCPU AMD
EPYC host, 2026-12-06); the measured steps are made up for the arithmetic, not figures of a chip."""

from __future__ import annotations

import json
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.common import benchmark_script

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks" / "chip"
FLOPS = 9496172691456.0  # 6N + 12LHQT x tokens of the default shape at 2 x 2048 (both sides count it)
PREDICTED = {
    "shape": "decoder:vocab=32000,d_model=2048,layers=6,heads=16,kv_heads=4,mlp=5632,max_seq_len=2048",
    "topology": "v5e-1",
    "global_batch": 2,
    "seq_len": 2048,
    "layout": "Layout(data=1, fsdp=1, tensor=1)",
    "remat": "full",
    "flash_block": 512,
    "model_flops_per_step": FLOPS,
    "predicted_step_s": 0.08618837352706718,
    "predicted_mfu": 0.5592856706655049,
    "band_points": 26.36243027631261,
    "peak_tflops_per_device": 197.0,
}
TUNED_CONFIG = """format_version = 1
device_kind = "tpu"

[settings]
execution = "tpu"
autocast = "bfloat16"

[provenance]
device = "TPU v5e"

[provenance.baseline]
step_median_s = {baseline}
step_source = "steady step, interleaved verification window"
mfu = 0.196

[provenance.tuned]
step_median_s = {tuned}
step_source = "steady step, interleaved verification window"
mfu = 0.41

[provenance.verification]
message = "verified: 2.10x (95% CI 2.05-2.15, 12 interleaved rounds)"
"""


@pytest.fixture(scope="module")
def beside() -> Iterator[types.ModuleType]:
    """The benchmark as a module. It imports its siblings (tpu_chip_check, tpu_attention_kernel), which a
    script finds beside itself: here their folder is on sys.path while the module's tests run."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield benchmark_script(BENCHMARKS / "tpu_mfu_beside_jax.py", "tpu_mfu_beside_jax_under_test")
    finally:
        sys.path.remove(str(BENCHMARKS))


def _exported(out: Path) -> Path:
    """OUT as the planning host's export leaves it: the step and its prediction."""
    step_dir = out / "jax" / "full"
    step_dir.mkdir(parents=True)
    (step_dir / "step.jaxexport").write_bytes(b"exported")
    (step_dir / "predicted.json").write_text(json.dumps(PREDICTED))
    return step_dir


def _profile(model_flops: float, median: float) -> str:
    formula = "(6N + 12LHQT) x tokens, N=336,068,608 matmul parameters"
    return json.dumps(
        {"flops": {"model_per_step": model_flops, "model_formula": formula}, "timing": {"median": median}, "mfu": 0.3}
    )


def _fake_chip(
    out: Path, calls: list[tuple[list[str], dict[str, str]]], tuned: float, tuner_flops: float = FLOPS
) -> Any:
    """subprocess.run as each part's process would leave OUT (the JAX step at 0.11 s)."""

    def run(command: list[str], cwd: Any, env: dict[str, str], stdout: Any, stderr: Any) -> Any:
        calls.append((command, env))
        if "run" in command:  # tpu_chip_check.py run
            measured = {"device": "TPU v5 lite", "step_s_median": 0.11, "step_s_min": 0.1098, "step_s_max": 0.1103}
            (out / "jax" / "full" / "measured.json").write_text(json.dumps(measured))
        elif "profile" in command:
            folder = out / "obvious" / "decoder-20261206-120000"
            folder.mkdir(parents=True)
            (folder / "profile.json").write_text(_profile(FLOPS, 0.16))
        else:  # the tuning run
            folder = out / "torchtpu" / "decoder-tune-20261206-120000"
            folder.mkdir(parents=True)
            (folder / "tuned_config.toml").write_text(TUNED_CONFIG.format(baseline=0.246, tuned=tuned))
            (folder / "profile.json").write_text(_profile(tuner_flops, 0.246))
        stdout.write("done\n")
        return types.SimpleNamespace(returncode=0)

    return run


def test_it_refuses_in_one_line_without_a_tpu(beside: Any, tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    monkeypatch.setattr(beside, "tpu_chips_on_host", lambda: {})
    monkeypatch.setattr(beside.subprocess, "run", lambda *a, **k: pytest.fail("ran a process without a chip"))
    assert beside.main(["--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no TPU chip" in err and "--dry-run" in err
    assert not (tmp_path / "out").exists()


def test_the_dry_run_plans_here_and_prints_the_chips_commands(
    beside: Any, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    exports: list[tuple[Any, ...]] = []

    def export(folder: Path, *rest: Any) -> None:  # the planner's export, as tpu_chip_check writes it
        exports.append(rest)
        _exported(folder.parent.parent)

    monkeypatch.setattr(beside, "tpu_chips_on_host", lambda: {})
    monkeypatch.setattr(beside.tpu_chip_check, "export", export)
    monkeypatch.setattr(beside.subprocess, "run", lambda *a, **k: pytest.fail("a dry run runs no process"))
    assert beside.main(["--dry-run", "--out", str(tmp_path / "out"), "--time-budget", "6m"]) == 0
    assert exports == [(PREDICTED["shape"], "v5e-1", 2, 2048, "full", 512)]
    printed = capsys.readouterr().out
    assert "predicted step 0.0862 s, MFU 55.9% +- 26.4 points" in printed
    lines = [line for line in printed.splitlines() if line.lstrip().startswith("[")]
    assert [line.split()[0] for line in lines] == ["[jax]", "[torchtpu]", "[obvious]"]
    assert "without the TorchTPU site" in lines[0] and "tpu_chip_check.py run" in lines[0]
    assert "-m tpu_tuner.cli -q decoder:" in lines[1] and "--device tpu --batch-size 2 --seq 2048" in lines[1]
    assert "--time-budget 6m" in lines[1]
    assert "profile decoder:" in lines[2] and "--compile tpu --autocast bfloat16" in lines[2]
    assert "python benchmarks/chip/tpu_mfu_beside_jax.py --out" in printed
    assert "--dry-run" not in printed.split("carried")[1]
    # tpu-tune's own clock and another space pass through; the export is not made twice.
    assert (
        beside.main(["--dry-run", "--out", str(tmp_path / "out"), "--time-budget", "default", "--space", "torchtpu"])
        == 0
    )
    tuned = next(line for line in capsys.readouterr().out.splitlines() if line.lstrip().startswith("[torchtpu]"))
    assert "--time-budget" not in tuned and "--space torchtpu" in tuned and len(exports) == 1


def test_on_a_chip_the_parts_run_in_turn_and_the_table_compares_them(
    beside: Any, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    out = tmp_path / "out"
    _exported(out)
    site = tmp_path / "torchtpu-site"
    (site / "torch_tpu").mkdir(parents=True)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), "/opt/extra"]))
    calls: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(beside, "tpu_chips_on_host", lambda: {"v5e": 1})
    monkeypatch.setattr(beside.subprocess, "run", _fake_chip(out, calls, tuned=0.118))
    assert beside.main(["--out", str(out)]) == 0
    parts = [(Path(c[1]).name, c[2]) if c[1] != "-m" else (c[2], c[3]) for c, _ in calls]
    # JAX first, on a chip nothing else has touched; no export: the step came with OUT.
    assert parts == [("tpu_chip_check.py", "run"), ("tpu_tuner.cli", "-q"), ("tpu_tuner.cli", "profile")]
    assert calls[0][1]["PYTHONPATH"] == "/opt/extra"  # JAX never sees torch-tpu's libtpu
    assert calls[1][1]["PYTHONPATH"].split(os.pathsep)[0] == str(site)
    summary = json.loads((out / "beside_jax.json").read_text())
    rows = summary["rows"]
    peak = 197e12
    assert rows["jax"]["mfu"] == pytest.approx(FLOPS / 0.11 / peak)
    assert rows["torchtpu_tuned"]["mfu"] == pytest.approx(FLOPS / 0.118 / peak)
    assert rows["torchtpu_tuned"]["mfu_stated"] == 0.41  # tpu-tune's own figure, kept beside
    assert rows["torchtpu_obvious"]["mfu"] == pytest.approx(FLOPS / 0.16 / peak)
    assert summary["tuned_over_jax_mfu"] == pytest.approx(0.11 / 0.118)
    assert summary["target_met"] is True and summary["notes"] == []
    printed = capsys.readouterr().out
    assert "TorchTPU tuned MFU / JAX MFU: 93.2% (met); target >= 90%" in printed
    assert "verified: 2.10x" in printed
    planner = next(line for line in printed.splitlines() if line.startswith("planner's prediction"))
    assert "0.0862" in planner and "1.000" in planner and "band +- 26.4" in planner


def test_a_short_tuned_mfu_a_failed_part_and_other_flops_are_said(
    beside: Any, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    out = tmp_path / "out"
    _exported(out)
    calls: list[tuple[list[str], dict[str, str]]] = []
    fake = _fake_chip(out, calls, tuned=0.2, tuner_flops=FLOPS * 1.5)
    monkeypatch.setattr(beside, "tpu_chips_on_host", lambda: {"v5e": 1})
    monkeypatch.setattr(beside.subprocess, "run", fake)
    assert beside.main(["--out", str(out), "--parts", "jax", "torchtpu"]) == 0
    summary = json.loads((out / "beside_jax.json").read_text())
    assert summary["tuned_over_jax_mfu"] == pytest.approx(0.11 / 0.2) and summary["target_met"] is False
    assert summary["rows"]["torchtpu_obvious"] == {"step_s": None, "mfu": None, "failure": "not run"}
    assert len(summary["notes"]) == 1 and "tpu-tune's run counted 1.424e+13" in summary["notes"][0]
    printed = capsys.readouterr().out
    assert "55.0% (NOT met)" in printed and "TorchTPU tpu compile + bf16 autocast" in printed

    # The obvious recipe's process then fails: its row says how, and --table rebuilds the rest.
    def failing(command: list[str], cwd: Any, env: Any, stdout: Any, stderr: Any) -> Any:
        stdout.write("RuntimeError: a required argument is in a failed state\n")
        return types.SimpleNamespace(returncode=1)

    monkeypatch.setattr(beside.subprocess, "run", failing)
    assert beside.main(["--out", str(out), "--parts", "obvious"]) == 0
    assert beside.main(["--out", str(out), "--table"]) == 0
    obvious = json.loads((out / "beside_jax.json").read_text())["rows"]["torchtpu_obvious"]
    assert obvious["failure"] == "exit status 1: RuntimeError: a required argument is in a failed state"


def test_a_failed_jax_run_leaves_no_stale_figure(beside: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    step_dir = _exported(out)
    (step_dir / "measured.json").write_text(json.dumps({"step_s_median": 0.11}))  # an earlier run's
    (out / "jax.exit.json").write_text(json.dumps({"exit_status": 1, "last_line": "RESOURCE_EXHAUSTED"}))
    summary = beside.summarise(out, "full")
    assert summary["rows"]["jax"]["failure"] == "exit status 1: RESOURCE_EXHAUSTED"
    assert summary["tuned_over_jax_mfu"] is None and summary["target_met"] is None
    assert "n/a (exit status 1: RESOURCE_EXHAUSTED)" in beside.table(summary)


def test_the_environments_split_the_site_folder(beside: Any, tmp_path: Path) -> None:
    found = tmp_path / "found"
    (found / "torch_tpu").mkdir(parents=True)
    jax_env, torch_env = beside.environments({"PYTHONPATH": f"{found}{os.pathsep}/a", "HOME": "/h"}, "/given/site")
    assert jax_env == {"PYTHONPATH": "/a", "HOME": "/h"}
    assert torch_env["PYTHONPATH"].split(os.pathsep) == ["/given/site", str(found), "/a"]
    jax_env, torch_env = beside.environments({"PYTHONPATH": str(found)}, None)
    assert "PYTHONPATH" not in jax_env and torch_env["PYTHONPATH"] == str(found)


def test_on_a_chip_without_the_exported_step_it_exports_or_stops(
    beside: Any, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    out = tmp_path / "out"
    calls: list[list[str]] = []

    def no_planner(command: list[str], cwd: Any, env: Any, stdout: Any, stderr: Any) -> Any:
        calls.append(command)
        stdout.write("ModuleNotFoundError: No module named 'torch'\n")  # a chip host's JAX-only python
        return types.SimpleNamespace(returncode=1)

    monkeypatch.setattr(beside, "tpu_chips_on_host", lambda: {"v5e": 1})
    monkeypatch.setattr(beside.subprocess, "run", no_planner)
    assert beside.main(["--out", str(out), "--parts", "torchtpu"]) == 1
    assert len(calls) == 1 and calls[0][2] == "export"  # nothing else held the chip for nothing
    assert "no exported JAX step" in capsys.readouterr().err
    assert json.loads((out / "export.exit.json").read_text())["last_line"].startswith("ModuleNotFoundError")
