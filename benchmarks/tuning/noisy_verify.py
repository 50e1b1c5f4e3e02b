"""A disturbed round does not change the verdict (issue 38): a fast setting verified against the
baseline while a CPU burner takes every core for exactly one round.

    PYTHONPATH=. python benchmarks/tuning/noisy_verify.py                      # cnn and gpt, 10 repeats each
    PYTHONPATH=. python benchmarks/tuning/noisy_verify.py --models examples/cnn.py --repeats 3

Each repeat is one verification as a run's finish does it (tuning/verify/verify_window.py), with the
baseline and the setting only (no knob-by-knob contributions): a fresh window in the warm worker,
`--rounds` planned rounds, rounds added while the interval cannot decide and the clock
(`--clock`, what the default 4-minute run clock leaves the verification; the issue's run had 76 s
unused) has room, disturbed rounds left out and re-run. Just before round `--burn-round` a burner
process per core starts spinning (it reports itself running before the round starts), and it is
killed as soon as that round ends. Printed per repeat: the verdict, the estimate and interval,
the rounds used, the rounds the rule found disturbed; at the end the count verified.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tpu_tuner.metrics.paired import VerdictKind
from tpu_tuner.profiling import ProfilerSettings
from tpu_tuner.runner.load import load_summary
from tpu_tuner.runner.trial_runner import TrialRunner
from tpu_tuner.tuning import TuneOptions
from tpu_tuner.tuning.options.tune_options import ObjectiveOptions, RunnerOptions
from tpu_tuner.tuning.run.clock import Clock
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.verify.interleaved import InterleavedWindow
from tpu_tuner.tuning.verify.verification import CLOCKED_CEILING
from tpu_tuner.tuning.verify.verify_window import measure_until_decided

# A setting about 2x the baseline's speed on each example on a 2-core CPU (docs/search-efficiency.md).
SETTINGS = {
    "cnn": "execution=inductor,autocast=bfloat16,memory_format=channels_last",
    "gpt": "execution=inductor,autocast=bfloat16",
}
BURNER = "import sys; sys.stdout.write('x'); sys.stdout.flush()\nwhile True: pass"


class Burner:
    """One spinning process per core, started and stopped around one round."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        cores = os.cpu_count() or 1
        self.processes = [
            subprocess.Popen([sys.executable, "-c", BURNER], stdout=subprocess.PIPE) for _ in range(cores)
        ]
        for process in self.processes:  # each says it runs before the round starts
            assert process.stdout is not None and process.stdout.read(1) == b"x"

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()
        self.processes = []


def _cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


def _candidates(model: Path, setting: str) -> tuple[list[dict[str, str]], str]:
    space = SearchSpace.load("default", "cpu")
    chosen = dict(pair.split("=", 1) for pair in setting.split(",") if pair)
    tuned = space.to_candidate(space.complete(chosen))
    return [space.to_candidate(space.baseline_params()).to_dict(), tuned.to_dict()], tuned.describe()


def _repeat(
    runner: TrialRunner, candidates: list[dict[str, str]], options: TuneOptions, args: argparse.Namespace
) -> tuple[str, bool]:
    burner = Burner()

    def progress(done: int, rounds: int, ratio: float) -> None:
        if done == args.burn_round - 1:
            burner.start()
        elif burner.processes:
            burner.stop()

    clock = Clock(args.clock, time.perf_counter())
    window = InterleavedWindow(runner, candidates, options.runner)
    try:
        decided = measure_until_decided(window, args.rounds, CLOCKED_CEILING, clock.left_to_work, progress)
    finally:
        burner.stop()
    if isinstance(decided, str):
        return f"failed: {decided}", False
    s = decided.speedup
    found = ", ".join(str(i + 1) for i in decided.disturbed) or "none"
    burned = args.burn_round - 1
    steps = " / ".join(
        f"{series[burned] * 1e3:.0f} ms (median {statistics.median(series) * 1e3:.0f})" for series in decided.samples
    )
    line = (
        f"{decided.verdict:>10}  {s.speedup:5.2f}x [{s.ci_low:.2f}-{s.ci_high:.2f}] at {s.level:.1%}, "
        f"{len(decided.samples[0])} rounds ({decided.looks} looks, stopped: {decided.stopped_by}), "
        f"disturbed: {found}; burned round {args.burn_round}: baseline / tuned {steps}; {clock.elapsed():.0f} s"
    )
    return line, decided.verdict is VerdictKind.VERIFIED


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", type=Path, default=[Path("examples/cnn.py"), Path("examples/gpt.py")])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--setting", help="knob=value,... verified against the baseline (default: per model)")
    parser.add_argument("--rounds", type=int, default=TuneOptions().objective.verify_rounds)
    parser.add_argument("--burn-round", type=int, default=5, help="the round the burner runs through (2 or more)")
    parser.add_argument("--clock", type=float, default=75.0, help="seconds the verification may take")
    args = parser.parse_args()
    if args.burn_round < 2:
        parser.error("--burn-round must be 2 or more (the burner starts after the round before it)")
    print(f"host: {_cpu_model()}, {os.cpu_count()} cores; python {platform.python_version()}")
    options = TuneOptions(
        objective=ObjectiveOptions(verify_rounds=args.rounds),
        runner=RunnerOptions(trial_settings=ProfilerSettings.load()),
    )
    for model in args.models:
        setting = args.setting or SETTINGS.get(model.stem, SETTINGS["gpt"])
        candidates, label = _candidates(model, setting)
        print(f"\n{model}: {label} against the baseline; {args.repeats} repeats, clock {args.clock:.0f} s each")
        verified = 0
        with TrialRunner(str(model)) as runner:
            load_summary(runner, model)
            for repeat in range(args.repeats):
                line, ok = _repeat(runner, candidates, options, args)
                verified += ok
                print(f"  {repeat + 1:2d}. {line}", flush=True)
        print(f"{model}: verified {verified}/{args.repeats}")


if __name__ == "__main__":
    main()
