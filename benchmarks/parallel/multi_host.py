"""Studies over ranks, one part a question: `python benchmarks/parallel/multi_host.py --only PART`.

    python benchmarks/parallel/multi_host.py --only inference [--nproc 2] [--trials 6] [--time-budget 3m] [--prune]
    python benchmarks/parallel/multi_host.py --only inference --runs results/<cnn run>/ results/<mlp run>/
    python benchmarks/parallel/multi_host.py --only trials --only kill        # across hosts (multi_host_trials.py)

``inference``: ``python -m tpu_tuner.cli examples/cnn.py --nproc 2 ...`` and the same for
examples/mlp.py (both inference files: no loss), as a user runs them (with ``--no-prune`` unless
``--prune``: every trial measured to the end); then, from each run folder
(trials.csv's ``layout`` column, result.json's verification and the space's left-out layouts), the
step time per layout (the fastest feasible setting of each, and the layout alone where it was
measured) and the verified best with its interval. The host's CPU model and load average are
printed before and after, since other processes on a shared host move every figure.

The parts are the `PARTS` mapping: the multi-host trials (ranks over ``--nnodes`` hosts) are to be
added there as parts of their own.
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INFERENCE_FILES = ("examples/cnn.py", "examples/mlp.py")


def host_lines() -> list[str]:
    """The CPU model (lscpu) and the load average (uptime), as the docs quote them."""
    model = next(
        (line.split(":", 1)[1].strip() for line in _run(["lscpu"]).splitlines() if line.startswith("Model name")),
        "unknown",
    )
    return [f"host: {model}; {_run(['uptime']).strip()}"]


def _run(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def tune(model_file: str, args: argparse.Namespace) -> Path:
    """Run the user's command on `model_file`; the run folder it made."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    before = {p for p in out.iterdir() if p.is_dir()}
    command = [
        sys.executable,
        "-m",
        "tpu_tuner.cli",
        str(ROOT / model_file),
        "--nproc",
        str(args.nproc),
        "--trials",
        str(args.trials),
        "--time-budget",
        args.time_budget,
        "--out",
        str(out),
    ]
    if not args.prune:
        # Each layout's figure a median of a whole timing, not the first steps of a pruned trial.
        command.append("--no-prune")
    print("$ " + " ".join(command[1:]), flush=True)
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{model_file}: tpu-tune exited with {done.returncode}: {done.stderr.strip()[-400:]}")
    made = sorted({p for p in out.iterdir() if p.is_dir()} - before, key=lambda p: p.stat().st_mtime)
    if not made:
        raise SystemExit(f"{model_file}: no run folder appeared in {out}")
    print(f"  {time.monotonic() - started:.0f} s", flush=True)
    return made[-1]


def layout_lines(run_dir: Path) -> list[str]:
    """Per layout: settings measured, pruned, failed; the fastest feasible steady step and its
    settings; the layout alone (every other knob at its baseline) where measured."""
    with (run_dir / "trials.csv").open() as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("layout") and not row.get("repeat_of")]
    record = json.loads((run_dir / "result.json").read_text())
    knobs = [name for name in rows[0] if name in {p["name"] for p in record["space"]["params"]}] if rows else []
    baseline = {p["name"]: p["choices"][0] for p in record["space"]["params"]}
    lines = []
    for layout in dict.fromkeys(row["layout"] for row in rows):
        own = [row for row in rows if row["layout"] == layout and (row.get("step_median_s") or row.get("early_stop"))]
        pruned = [row for row in own if row.get("early_stop")]
        full = [row for row in own if not row.get("early_stop") and row.get("feasible") == "True"]
        failed = [row for row in rows if row["layout"] == layout and row.get("failure_kind")]
        line = f"  {layout}: {len(own)} measured ({len(pruned)} pruned, {len(failed)} failed)"
        if full:
            best = min(full, key=lambda row: float(row["step_median_s"]))
            others = ", ".join(f"{k}={best[k]}" for k in knobs if k != "layout" and not _at_baseline(best, k, baseline))
            line += (
                f"; fastest {float(best['step_median_s']) * 1e3:.1f} ms a step (trial {best['number']}: "
                f"{others or 'every other knob at its baseline'}; error {float(best['accuracy_error']):.1e})"
            )
            alone = [row for row in full if all(_at_baseline(row, k, baseline) for k in knobs if k != "layout")]
            if alone and alone[0] is not best:
                line += f"; alone {float(alone[0]['step_median_s']) * 1e3:.1f} ms"
        if pruned:
            # A pruned trial's fastest step before it stopped: the least it would have measured.
            fastest = [min(ast.literal_eval(r["early_stop"])["steps"] or [float("nan")]) for r in pruned]
            line += "; pruned (fastest step) " + ", ".join(f"{f * 1e3:.0f}" for f in fastest) + " ms"
        lines.append(line)
    lines += [f"  left out: {line}" for line in record["space"].get("left_out", []) if line.startswith("layout")]
    verification = record["verification"]
    chosen = verification["chosen"]
    lines.append(
        f"  verification: {verification['message']} -> layout {chosen.get('layout')}, "
        + ", ".join(f"{k}={v}" for k, v in chosen.items() if k != "layout" and v != baseline.get(k, v))
    )
    return lines


def _at_baseline(row: dict[str, str], knob: str, baseline: dict[str, str]) -> bool:
    # An inactive conditional knob (compile options without inductor) is empty: its baseline.
    return row[knob] in ("", baseline.get(knob))


def inference_part(args: argparse.Namespace) -> None:
    """Inference layouts of examples/cnn.py and examples/mlp.py on `args.nproc` ranks."""
    runs = [Path(r) for r in args.runs] if args.runs else None
    for line in host_lines():
        print(line)
    for index, model_file in enumerate(INFERENCE_FILES):
        run_dir = runs[index] if runs else tune(model_file, args)
        print(f"{model_file} on {args.nproc} ranks: {run_dir}")
        for line in layout_lines(run_dir):
            print(line)
    for line in host_lines():
        print(line)


def _hosts(part: str) -> Callable[[argparse.Namespace], None]:
    """A part of benchmarks/parallel/multi_host_trials.py (trials across hosts) with this script's options."""

    def run(args: argparse.Namespace) -> None:
        import multi_host_trials

        getattr(multi_host_trials, part)(
            argparse.Namespace(model=args.model, rounds=args.rounds, trials=args.host_trials)
        )

    return run


# Part name -> what it runs: inference layouts on one host; trials across hosts (2 hosts x 1 rank
# against 1 host x 2 ranks) and a host SIGKILLed mid-trial (benchmarks/parallel/multi_host_trials.py).
PARTS: dict[str, Callable[[argparse.Namespace], None]] = {
    "inference": inference_part,
    "trials": _hosts("trials"),
    "kill": _hosts("kill"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(PARTS), action="append", help="the parts to run (default: all)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--time-budget", default="3m")
    parser.add_argument("--out", default=str(ROOT / "results" / "bench-multi-host"))
    parser.add_argument(
        "--prune",
        action="store_true",
        help="let the study prune hopeless trials (default: "
        "every trial measured to the end, so that each layout has a median)",
    )
    parser.add_argument("--runs", nargs="+", help="summarise these finished runs (in the part's order) instead")
    parser.add_argument("--model", default=str(ROOT / "examples" / "gpt.py"), help="trials / kill: the model file")
    parser.add_argument("--rounds", type=int, default=4, help="trials: verification rounds")
    parser.add_argument("--host-trials", type=int, default=3, help="trials / kill: measured settings a study")
    args = parser.parse_args()
    for name in args.only or list(PARTS):
        print(f"== {name}")
        PARTS[name](args)


if __name__ == "__main__":
    main()
