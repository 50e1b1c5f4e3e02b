"""Eight outside-style models tuned under the default clock, each run's report read back against
its own files (issue 55's targets: no false sentence, every run within 5% of its clock).

The models: a MobileNet-style network with outputs of about 1e-21, a ViT, a BERT encoder, a GRU
language model, KernelBench's LSTM (a benchmark-convention file), a small CNN, a transformer
encoder and the README's GPT (whose inductor compile is the slow one). Each is a whole `tpu-tune`
process with its default clock (`--time-budget`, 4 min); its wall time is taken around the
process. Then `tpu_tuner.tuning.run.run_audit.audit` reads each run folder (report.md against
trials.csv, result.json, run.json, profile.json and tuned_config.toml) and every finding is printed.

    python benchmarks/models/outside_check.py [--out results/outside] [--only NAME ...] [--audit-only]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODELS = [
    "benchmarks/models/outside_models/mobilenet_tiny_outputs.py",
    "benchmarks/models/outside_models/vit_inference.py",
    "benchmarks/models/outside_models/bert_inference.py",
    "benchmarks/models/outside_models/gru_inference.py",
    "tests/fixtures/kernelbench_lstm.py",
    "examples/cnn.py",
    "examples/encoder.py",
    "examples/gpt.py",
]
CLOCK_S = 240.0  # tpu-tune's default --time-budget
WALL_FILE = "outside_walls.json"


def run(model: str, out: Path) -> tuple[Path | None, float, int]:
    """One default-clock `tpu-tune` run of `model`: its folder, wall seconds and exit status."""
    before = set(out.glob(f"{Path(model).stem}-tune-*"))
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "tpu_tuner.cli", "-q", model, "--out", str(out)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wall = time.perf_counter() - started
    made = sorted(set(out.glob(f"{Path(model).stem}-tune-*")) - before)
    if done.returncode:
        print(f"{model}: exit {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1]}", flush=True)
    return (made[-1] if made else None), wall, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "results" / "outside")
    parser.add_argument("--only", nargs="+", help="model file stems to run (default: all eight)")
    parser.add_argument("--audit-only", action="store_true", help="read the run folders already under --out")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    walls_path = args.out / WALL_FILE
    walls = json.loads(walls_path.read_text()) if walls_path.exists() else {}
    models = [m for m in MODELS if not args.only or Path(m).stem in args.only]
    if not args.audit_only:
        for model in models:
            run_dir, wall, status = run(model, args.out)
            if run_dir is not None:
                walls[run_dir.name] = {"wall_s": wall, "exit_status": status}
                walls_path.write_text(json.dumps(walls, indent=2) + "\n")
            print(f"{model}: {wall:.0f} s ({wall / CLOCK_S - 1:+.1%} of the clock)", flush=True)
    from tpu_tuner.tuning.run.run_audit import audit

    total = 0
    print("| model | verdict | wall s | over the clock | findings |")
    print("|---|---|---:|---:|---|")
    for model in models:
        runs = sorted(args.out.glob(f"{Path(model).stem}-tune-*"))
        if not runs:
            print(f"| {model} | no run folder | | | |")
            continue
        run_dir = runs[-1]
        wall = walls.get(run_dir.name, {}).get("wall_s")
        findings = audit(run_dir, wall_s=wall)
        total += len(findings)
        verdict = _verdict(run_dir)
        over = f"{wall / CLOCK_S - 1:+.1%}" if wall else "n/a"
        print(f"| {Path(model).stem} | {verdict[:70]} | {wall or 0:.0f} | {over} | {len(findings)} |")
        for finding in findings:
            print(f"|   | {finding} | | | |")
    print(f"false sentences found: {total}")


def _verdict(run_dir: Path) -> str:
    result = run_dir / "result.json"
    if not result.exists():
        return "no result.json"
    return str(json.loads(result.read_text()).get("verification", {}).get("message", ""))


if __name__ == "__main__":
    main()
