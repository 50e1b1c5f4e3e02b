"""Failure learning: measured settings a fixed budget spends on a knob value known to fail.

Four fault models (benchmarks/tuning/fault_models/), each failing under one knob value and fine under
every other setting, are tuned with the real CLI (`python -m tpu_tuner.cli`, the package on
PYTHONPATH: run it against the version before failure learning and the one after). For each run
the script reads the run folder back (trials.csv, result.json) and prints the settings measured
with the bad value, how many of them failed, the wall time and the verified speedup.

Target (issue 26): at most 2 measured settings per bad value (two failures of one kind are what
it takes to attribute a failure to a value; every further one is a wasted measurement).

    PYTHONPATH=. python benchmarks/tuning/failure_learning.py [--seeds 3] [--models crash oom] [--trials 12] [--out DIR]
    python benchmarks/tuning/failure_learning.py --read DIR [DIR ...]    # table earlier runs again, tune nothing

Figures of the version before failure learning: docs/failure-learning-draft.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from _failure_runs import BadValue, RunFigures, figures_of

REPO = Path(__file__).resolve().parents[2]
MODELS_DIR = Path(__file__).resolve().parent / "fault_models"
TARGET = 2  # measured settings per bad value


@dataclass(frozen=True)
class FaultModel:
    """A fault model file, the knob value it fails under, and what its run needs besides."""

    name: str
    bad: BadValue
    extra_args: tuple[str, ...] = ()
    note: str = ""

    @property
    def path(self) -> Path:
        return MODELS_DIR / f"{self.name}_model.py"


MODELS = (
    FaultModel("crash", BadValue("autocast", "bfloat16", "crash")),
    # --trial-memory-gb: the worker runs under an address-space limit, as the memory story needs.
    # --tolerance 0.05: bf16 autocast's gradient error on this small MLP's training step is just
    # over the default 1% (1.05% measured), an accidental second failure the model would then
    # carry; the benchmark wants one fault per model.
    FaultModel(
        "oom",
        BadValue("micro_batches", "4", "oom"),
        ("--trial-memory-gb", "2", "--tolerance", "0.05"),
        note="training step",
    ),
    FaultModel("accuracy", BadValue("intra_op_threads", "1", "accuracy")),
    FaultModel("fullgraph", BadValue("compile_options", "fullgraph", "error")),
)


@dataclass(frozen=True)
class Run:
    model: FaultModel
    seed: int
    run_dir: Path
    wall_s: float
    figures: RunFigures


def tune(model: FaultModel, seed: int, args: argparse.Namespace, out: Path) -> Run:
    """One CLI run of `model` with the fixed budget; returns its figures."""
    out = out / f"{model.name}-seed{seed}"
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob(f"{model.path.stem}-tune-*"))
    command = [
        sys.executable,
        "-m",
        "tpu_tuner.cli",
        "-q",
        str(model.path),
        "--trials",
        str(args.trials),
        "--verify-rounds",
        str(args.verify_rounds),
        "--seed",
        str(seed),
        "--cold",
        "--out",
        str(out),
        *model.extra_args,
    ]
    start = time.perf_counter()
    # Run from the results folder, not the checkout: `python -m` puts the working directory first
    # on sys.path, so from a checkout it would run that checkout's tpu_tuner, not PYTHONPATH's.
    done = subprocess.run(command, cwd=out, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    (run_dir,) = set(out.glob(f"{model.path.stem}-tune-*")) - before
    return Run(model, seed, run_dir, wall, figures_of(run_dir, model.bad))


def read_back(roots: list[Path]) -> list[Run]:
    """The runs an earlier invocation left in each root (`--out`), read again, not re-run. Wall
    time from that invocation's failure_learning.json; for a run it does not list, the run
    folder's own span (run.json: started to last update; the CLI's start-up is not in it)."""
    runs = []
    for root in roots:
        recorded = {}
        if (root / "failure_learning.json").exists():
            saved = json.loads((root / "failure_learning.json").read_text())
            recorded = {entry["run_dir"]: entry["wall_s"] for entry in saved["runs"]}
        for model in MODELS:
            for run_dir in sorted(root.glob(f"{model.name}-seed*/{model.path.stem}-tune-*")):
                seed = int(run_dir.parent.name.rsplit("seed", 1)[1])
                wall = recorded.get(str(run_dir))
                if wall is None:
                    state = json.loads((run_dir / "run.json").read_text())
                    span = datetime.fromisoformat(state["updated"]) - datetime.fromisoformat(state["started"])
                    wall = span.total_seconds()
                runs.append(Run(model, seed, run_dir, wall, figures_of(run_dir, model.bad)))
    return sorted(runs, key=lambda run: (MODELS.index(run.model), run.seed))


def header(args: argparse.Namespace) -> list[str]:
    """Where the figures were measured: host CPU, date, the tuner's version and commit."""
    return [
        f"host: {_cpu_model()} ({os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}), "
        f"Python {platform.python_version()}",
        f"date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        f"tuner: {_tuner_source()}",
        f"budget: --trials {args.trials} --verify-rounds {args.verify_rounds} --cold, seeds {_seeds(args)}",
    ]


def _cpu_model() -> str:
    """lscpu's "Model name" (the processor: where the step times come from)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown CPU"
    return next(
        (line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Model name")), "unknown CPU"
    )


def _tuner_source() -> str:
    """The tpu_tuner the CLI runs (the PYTHONPATH decides which) and its git commit."""
    probe = subprocess.run(
        [sys.executable, "-c", "import tpu_tuner; print(tpu_tuner.__file__)"],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
    )  # as `tune` runs it
    if probe.returncode != 0:
        return "tpu_tuner not importable"
    tree = Path(probe.stdout.strip()).parent.parent
    commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "-C", str(tree), "status", "--porcelain", "--", "tpu_tuner"], capture_output=True, text=True
    )
    state = " (tpu_tuner/ modified)" if dirty.stdout.strip() else ""
    return f"{tree} at {commit.stdout.strip() or 'no git commit'}{state}"


def _seeds(args: argparse.Namespace) -> list[int]:
    return list(range(args.first_seed, args.first_seed + args.seeds))


def _speedup(figures: RunFigures) -> str:
    """The verified speedup, or "not verified" and why (the verification's message, shortened)."""
    if figures.speedup is not None:
        return f"{figures.speedup:.2f}x"
    # The interval's level varies with the looks (metrics/paired.py): "(95% CI", "(99.2% CI".
    return f"not verified ({re.split(r' [(][0-9.]+% CI', figures.verification.split(';')[0])[0]})"


TABLE_HEADER = (
    f"{'model':10} {'seed':>4} {'bad value':28} {'measured':>8} {'bad':>4} {'queued':>6} "
    f"{'bad failed':>14} {'bad unmeasured':>14} {'wall':>6}  verified speedup"
)


def table_row(run: Run) -> str:
    """One run: measured settings (all; with the bad value; of those, how many were queued
    rather than sampled), how those failed, the trials with the bad value answered without
    measuring (repeats, rejections, exclusions), wall time, verified speedup."""
    f = run.figures
    failed = f"{f.bad_failed} ({f.bad_failed_as_expected} {run.model.bad.kind})"
    queued = "?" if f.bad_queued is None else str(f.bad_queued)
    chosen = "  CHOSEN SETTINGS CARRY THE BAD VALUE" if f.chosen_has_bad else ""
    return (
        f"{run.model.name:10} {run.seed:>4} {str(run.model.bad):28} {f.measured:>8} {f.bad_measured:>4} "
        f"{queued:>6} {failed:>14} {f.bad_unmeasured:>14} {run.wall_s:>5.0f}s  {_speedup(f)}{chosen}"
    )


def summary(runs: list[Run]) -> list[str]:
    """Per model over its seeds: measured settings with the bad value (each seed, and the most)."""
    lines = []
    for model in dict.fromkeys(run.model for run in runs):
        mine = [run for run in runs if run.model == model]
        bad = [run.figures.bad_measured for run in mine]
        speedups = [run.figures.speedup for run in mine if run.figures.speedup is not None]
        shown = f"median {statistics.median(speedups):.2f}x" if speedups else "none"
        lines.append(
            f"{model.name:10} {str(model.bad):28} measured with it per seed {bad} (max {max(bad)}), "
            f"failed {[run.figures.bad_failed for run in mine]}, wall median "
            f"{statistics.median(run.wall_s for run in mine):.0f} s, verified speedups {shown} "
            f"({len(speedups)}/{len(mine)} verified)"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=[m.name for m in MODELS], default=[m.name for m in MODELS])
    parser.add_argument("--seeds", type=int, default=1, help="sampler seeds per model")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--trials", type=int, default=12, help="the fixed budget: settings measured per run")
    parser.add_argument("--verify-rounds", type=int, default=4)
    parser.add_argument("--out", type=Path, help="results folder for the runs (default: a temporary folder)")
    parser.add_argument(
        "--read",
        type=Path,
        nargs="+",
        metavar="OUT",
        help="tune nothing: read back the runs earlier invocations left in these --out folders",
    )
    args = parser.parse_args()

    if args.read:
        runs = [run for run in read_back([root.resolve() for root in args.read]) if run.model.name in args.models]
        if not runs:
            raise SystemExit(f"no runs of {', '.join(args.models)} in {', '.join(map(str, args.read))}")
        for root in args.read:  # where each invocation ran, as it printed it
            saved = root / "failure_learning.json"
            lines = json.loads(saved.read_text())["header"] if saved.exists() else ["(no failure_learning.json)"]
            print(f"{root}:\n  " + "\n  ".join(lines))
        print()
        print(TABLE_HEADER)
        print("\n".join(table_row(run) for run in runs))
        return verdict(runs)
    out = (args.out or Path(tempfile.mkdtemp(prefix="failure-learning-"))).resolve()
    where = header(args)
    print("\n".join(where))
    print(f"runs in {out}\n")
    print(TABLE_HEADER, flush=True)
    runs = []
    for model in (m for m in MODELS if m.name in args.models):
        for seed in _seeds(args):
            runs.append(tune(model, seed, args, out))
            print(table_row(runs[-1]), flush=True)
    # The figures as data too, beside the runs: for comparing this version's with another's.
    (out / "failure_learning.json").write_text(
        json.dumps(
            {
                "header": where,
                "runs": [
                    {
                        "model": run.model.name,
                        "bad_value": str(run.model.bad),
                        "seed": run.seed,
                        "run_dir": str(run.run_dir),
                        "wall_s": round(run.wall_s, 1),
                        **dataclasses.asdict(run.figures),
                    }
                    for run in runs
                ],
            },
            indent=1,
        )
    )
    verdict(runs)


def verdict(runs: list[Run]) -> None:
    """The per-model summary and the PASS/FAIL lines."""
    print("\nper model:")
    print("\n".join(summary(runs)))
    worst = max(run.figures.bad_measured for run in runs)
    held = worst <= TARGET
    print(
        f"\n{'PASS' if held else 'FAIL'}  at most {TARGET} measured settings per bad value (most in one run: {worst})"
    )
    if any(run.figures.chosen_has_bad for run in runs):
        print("FAIL  a run recommended settings that carry its bad value")


if __name__ == "__main__":
    main()
