"""The tuned setting against the obvious recipe (inductor + bf16 autocast), interleaved.

The obvious recipe is what an engineer tries first; the tuner earns its keep by what it finds
beyond it. For each model: `tpu-tune MODEL` with the given clock (or a run folder already made,
`--reuse`), then the tuned setting and the obvious one re-measured round-robin in one warm worker
(as the verification does), and the paired speedup of tuned over obvious with its 95% interval.

    python benchmarks/beyond_obvious.py [--models examples/cnn.py ...] [--time-budget 240] \\
        [--rounds 12] [--out results/beyond_obvious]

Default models: every example with a model of its own (gpt and llama training; cnn, mlp and
encoder inference) and three outside models (benchmarks/outside_models: a ViT, a BERT encoder, a
GRU language model). The issue's target: at least 1.3x on at least
half of them, every figure with its interval. Steady steps are compared (compile time is the
tuner's objective, not this comparison's).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.tuned_config import TunedConfig
from tpu_tuner.metrics.paired import paired_speedup
from tpu_tuner.profiling import ProfilerSettings
from tpu_tuner.runner.load import load_summary
from tpu_tuner.runner.trial_runner import TrialRunner
from tpu_tuner.tuning.interleaved import compare_interleaved
from tpu_tuner.tuning.options import RunnerOptions

REPO = Path(__file__).resolve().parent.parent
MODELS = [
    "examples/gpt.py",
    "examples/llama.py",
    "examples/cnn.py",
    "examples/mlp.py",
    "examples/encoder.py",
    "benchmarks/outside_models/vit_inference.py",
    "benchmarks/outside_models/bert_inference.py",
    "benchmarks/outside_models/gru_inference.py",
]
OBVIOUS = {"execution": "inductor", "autocast": "bfloat16"}
TARGET = 1.3


def tuned_config(model: Path, out: Path, time_budget: str, reuse: Path | None) -> Path:
    """The tuned_config.toml of a fresh `tpu-tune` run of `model` (or of the run folder `reuse`)."""
    if reuse is not None:
        return next(reuse.glob(f"{model.stem}-tune-*/tuned_config.toml"))
    before = set(out.glob(f"{model.stem}-tune-*"))
    command = [sys.executable, "-m", "tpu_tuner.cli", "-q", str(model), "--out", str(out)]
    subprocess.run([*command, "--time-budget", time_budget], check=True, stdout=subprocess.DEVNULL)
    (run_dir,) = set(out.glob(f"{model.stem}-tune-*")) - before
    return run_dir / "tuned_config.toml"


def compare(model: Path, tuned: Candidate, rounds: int) -> tuple[list[float], list[float]] | str:
    """Per-round steady steps of the obvious recipe and the tuned setting, interleaved."""
    trial = RunnerOptions(trial_settings=ProfilerSettings.load())
    with TrialRunner(str(model)) as runner:
        load_summary(runner, model, None, None)
        obvious = Candidate(dict(OBVIOUS))
        compared = compare_interleaved(runner, [obvious.to_dict(), tuned.to_dict()], rounds, trial, None)
    if isinstance(compared, str):
        return compared
    samples = compared[0]
    return samples[0], samples[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--time-budget", default="240", help="each tuning run's clock (seconds or 'none')")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--out", type=Path, default=REPO / "results" / "beyond_obvious")
    parser.add_argument("--reuse", type=Path, help="a folder of earlier runs: compare their tuned configs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"obvious recipe: {', '.join(f'{k}={v}' for k, v in OBVIOUS.items())}; {args.rounds} interleaved rounds")
    met = 0
    for name in args.models:
        model = (REPO / name) if not Path(name).is_absolute() else Path(name)
        start = time.perf_counter()
        config = TunedConfig.load(tuned_config(model, args.out, args.time_budget, args.reuse))
        tuned = config.candidate
        result = compare(model, tuned, args.rounds)
        wall = time.perf_counter() - start
        if isinstance(result, str):
            print(f"{name}: tuned {tuned.describe()}; comparison failed: {result} ({wall:.0f} s)")
            continue
        obvious_steps, tuned_steps = result
        speedup = paired_speedup(obvious_steps, tuned_steps)
        met += speedup.speedup >= TARGET
        median = sorted(obvious_steps)[len(obvious_steps) // 2]
        print(
            f"{name}: tuned {tuned.describe()}: {speedup.describe()} over the obvious recipe "
            f"(its median step {median * 1e3:.1f} ms); {wall:.0f} s",
            flush=True,
        )
    print(f"at least {TARGET}x over the obvious recipe: {met} of {len(args.models)} models")


if __name__ == "__main__":
    main()
