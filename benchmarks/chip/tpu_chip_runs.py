"""`tpu-tune` on a TPU host, as a user runs it: each workload of the list tuned with `--device tpu`,
and one JSON / table of what each run gave (verdict, MFU, settings measured, their costs).

Issue 54, item 1. The workloads: the README's example (examples/gpt.py), a Llama-class Hugging
Face model of about 0.4B parameters at batch 2 x 2048 (a training step), a vision model
(examples/cnn.py, an inference step) and the Llama-class model's forward pass (`--inference`). Each run is a whole
`python -m tpu_tuner.cli` process with its default clock unless `--time-budget` is given; a run
that fails is kept in the table with its exit status and last line. Needs TorchTPU on the host
(docs/torchtpu.md, "On a real chip", says how it was carried onto a lent chip); `--list` prints
the commands without running them.

    python benchmarks/chip/tpu_chip_runs.py [--only gpt llama] [--time-budget 240s] [--out results/tpu_runs]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
LLAMA = (
    "hf:llama?num_hidden_layers=6,hidden_size=2048,intermediate_size=5632,num_attention_heads=16,"
    "num_key_value_heads=4,vocab_size=32000"
)
# The 335M decoder benchmarks/chip/tpu_chip_check.py runs in JAX (d 1024, 16 layers, 8 heads of 128, MLP
# 4096, vocab 32000) as a Hugging Face Llama, at the JAX step's batch (issue 68, item 4).
DECODER_335M = (
    "hf:llama?num_hidden_layers=16,hidden_size=1024,intermediate_size=4096,num_attention_heads=8,"
    "num_key_value_heads=8,vocab_size=32000"
)
MEMORY_GRID = REPO / "benchmarks" / "chip" / "decoder_335m_memory.toml"
# name -> (model, extra arguments)
WORKLOADS: dict[str, tuple[str, list[str]]] = {
    "gpt": ("examples/gpt.py", []),  # the README's: a training step
    "llama": (LLAMA, ["--batch-size", "2", "--seq", "2048"]),  # a training step
    "cnn": ("examples/cnn.py", []),  # vision, inference
    "llama-inference": (LLAMA, ["--inference", "--batch-size", "8", "--seq", "2048"]),
    "decoder-335m": (DECODER_335M, ["--batch-size", "8", "--seq", "2048"]),  # a training step
    # The same step on a diagnostic grid: bf16 under `tpu` by checkpointing and attention kernel.
    "decoder-335m-memory": (
        DECODER_335M,
        ["--batch-size", "8", "--seq", "2048", "--sampler", "grid", "--space", str(MEMORY_GRID)],
    ),
}


def command(name: str, out: Path, time_budget: str | None, device: str = "tpu") -> list[str]:
    """The `tpu-tune` command line of workload `name` on `device`, writing its run folder under `out`."""
    model, extra = WORKLOADS[name]
    budget = ["--time-budget", time_budget] if time_budget else []
    return [sys.executable, "-m", "tpu_tuner.cli", "-q", model, "--device", device, "--out", str(out / name)] + [
        *extra,
        *budget,
    ]


def summarise(name: str, run_dir: Path | None, wall_s: float, returncode: int, last_line: str) -> dict[str, Any]:
    """What one run gave, from its folder's tuned_config.toml (its provenance) and trials.csv."""
    from tpu_tuner.knobs.tuned_config import TunedConfig

    row: dict[str, Any] = {"workload": name, "wall_s": round(wall_s, 1), "exit_status": returncode}
    if run_dir is None or not (run_dir / "tuned_config.toml").exists():
        row["failure"] = last_line
        return row
    config = TunedConfig.load(run_dir / "tuned_config.toml")
    provenance = config.provenance
    row["verdict"] = provenance["verification"]["message"]
    row["chosen"] = config.candidate.describe()
    for side in ("baseline", "tuned"):
        figures = provenance.get(side) or {}
        row[f"{side}_step_ms"] = _ms(figures.get("step_median_s"))
        row[f"{side}_mfu"] = figures.get("mfu")
        row[f"{side}_search_step_ms"] = _ms(figures.get("search_step_median_s"))
    row.update(_trial_costs(run_dir))
    return row


def _trial_costs(run_dir: Path) -> dict[str, Any]:
    """Settings measured, per minute of the run, and each measured trial's wall time and compile;
    the figures of report.md's cost line (`outputs/trial_costs.py`): settings measured per minute
    of trials, the median cost beyond compile and timed steps, and the run's worker starts."""
    import pandas as pd

    from tpu_tuner.outputs.trial_costs import trial_costs

    trials = pd.read_csv(run_dir / "trials.csv")
    measured = trials[trials["trial_wall_s"].notna()] if "trial_wall_s" in trials else trials.iloc[0:0]
    walls = [float(w) for w in measured.get("trial_wall_s", [])]
    compiles = [float(c) for c in measured.get("compile_s", []) if c == c]
    estimate_errors = [float(e) for e in measured.get("estimate_error", []) if e == e]
    costs = trial_costs(trials)
    result = run_dir / "result.json"
    return {
        "settings_measured": len(measured),
        "failed": int(measured["failure_kind"].notna().sum()) if "failure_kind" in measured else 0,
        "trial_wall_s_median": round(statistics.median(walls), 1) if walls else None,
        "trial_wall_s": [round(w, 1) for w in walls],
        "compile_s_median": round(statistics.median(compiles), 1) if compiles else None,
        "memory_estimate_error_median": statistics.median(estimate_errors) if estimate_errors else None,
        "settings_per_trial_minute": None if costs.per_minute is None else round(costs.per_minute, 2),
        "beyond_compile_and_steps_s_median": (
            None if costs.beyond_median_s is None else round(costs.beyond_median_s, 1)
        ),
        "worker_starts": json.loads(result.read_text()).get("worker_starts") if result.exists() else None,
        # Of the beyond: the parts the worker told apart (memory estimate, build, accuracy check).
        "phase_medians_s": {key: round(value, 1) for key, value in costs.phase_medians_s.items()},
        "trials": [_trial(row) for _, row in measured.iterrows()],
    }


def _trial(row: Any) -> dict[str, Any]:
    """One measured trial in a line: its setting, step, compile and outcome (what a compile scope
    or a memory trade did to them, read off the run at a glance)."""
    from tpu_tuner.knobs import registry as knobs

    # The columns trials.csv has: the knobs the run's space searched (a single-choice one has none).
    searched = [f"{name}={row[name]}" for name in knobs.names() if name in row and row[name] == row[name]]
    step = row.get("step_median_s")
    return {
        "number": int(row["number"]),
        "setting": ", ".join(searched),
        "outcome": row.get("outcome"),
        "step_ms": _ms(step) if step == step else None,
        "compile_s": round(float(row["compile_s"]), 1) if row.get("compile_s") == row.get("compile_s") else None,
        "failure": row.get("failure_message") if row.get("failure_message") == row.get("failure_message") else None,
    }


def _ms(seconds: Any) -> float | None:
    return None if seconds is None else round(float(seconds) * 1e3, 2)


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (docs/torchtpu.md takes it as it is)."""
    head = (
        "| workload | verdict | baseline ms (MFU) | tuned ms (MFU) | settings / min (of trials) | trial median s "
        "| beyond compile and steps, median s (worker starts) | wall s |"
    )
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        # Over the whole run (profile and verification included), and over its trials' wall time.
        per_minute = r.get("settings_measured", 0) / (r["wall_s"] / 60) if r["wall_s"] else 0
        lines.append(
            f"| {r['workload']} | {(r.get('verdict') or r.get('failure') or '')[:90]} | "
            f"{_cell(r.get('baseline_step_ms'), r.get('baseline_mfu'))} | "
            f"{_cell(r.get('tuned_step_ms'), r.get('tuned_mfu'))} "
            f"| {per_minute:.1f} ({r.get('settings_per_trial_minute')}) | {r.get('trial_wall_s_median')} "
            f"| {r.get('beyond_compile_and_steps_s_median')} ({r.get('worker_starts')}) | {r['wall_s']} |"
        )
    return "\n".join(lines)


def _cell(step_ms: float | None, mfu: float | None) -> str:
    return "n/a" if step_ms is None else f"{step_ms:.4g} ({mfu:.1%})" if mfu is not None else f"{step_ms:.4g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", nargs="+", choices=sorted(WORKLOADS), default=["gpt", "llama", "cnn", "llama-inference"]
    )
    parser.add_argument("--time-budget", help="each run's clock (default: tpu-tune's own)")
    parser.add_argument("--out", type=Path, default=REPO / "results" / "tpu_runs")
    parser.add_argument("--list", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--device", default="tpu", help="tpu (the default); cpu tries the script itself here")
    args = parser.parse_args()
    rows = []
    for name in args.only:
        cmd = command(name, args.out, args.time_budget, args.device)
        if args.list:
            print(" ".join(cmd))
            continue
        (args.out / name).mkdir(parents=True, exist_ok=True)
        before = set((args.out / name).iterdir())
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - start
        new = sorted(set((args.out / name).iterdir()) - before)
        # tpu-tune's own last line: a failure before the run folder ends with where TorchTPU's lines were kept.
        output = [
            line
            for line in (done.stdout + done.stderr).strip().splitlines()
            if not line.startswith("tpu-tune: what TorchTPU and libtpu wrote")
        ]
        rows.append(summarise(name, new[-1] if new else None, wall, done.returncode, output[-1] if output else ""))
        print(json.dumps(rows[-1]), flush=True)
    if rows:
        (args.out / "runs.json").write_text(json.dumps(rows, indent=2) + "\n")
        print(table(rows))


if __name__ == "__main__":
    main()
