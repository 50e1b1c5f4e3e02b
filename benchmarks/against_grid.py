"""The configuration a tuning run chose, against the best setting of a full grid on the same
workload, re-measured interleaved (baseline, chosen, grid's best: round-robin in one worker).

    python benchmarks/against_grid.py --run results/<tpu-tune run> --grid-run results/<grid run>

Issue 13's target for examples/gpt.py training: the chosen setting's speed within 3% of the grid's
best (the ratio chosen / grid's best >= 0.97). The grid's best is its fastest feasible amortised
step, as the search ranks; both speedups over the baseline are printed with 95% intervals.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from tpu_tuner.metrics.paired import paired_speedup
from tpu_tuner.runner.pool import TrialRunner
from tpu_tuner.tuning import TuningResult, trial_attrs
from tpu_tuner.tuning.verify import compare_interleaved

WITHIN = 0.97


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="the tuning run whose chosen config is checked")
    parser.add_argument("--grid-run", type=Path, required=True, help="a run of the same workload made with --sampler grid")
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()

    run, grid = TuningResult.load(args.run), TuningResult.load(args.grid_run)
    feasible = [t for t in grid.study.trials if trial_attrs.is_feasible(t) and "repeat_of" not in t.user_attrs]
    grid_best = min(feasible, key=lambda t: t.value)
    chosen = run.verification.chosen
    candidates = {
        "baseline": grid.space.to_candidate(grid.space.baseline_params()),
        "chosen": chosen,
        "grid's best": grid.space.to_candidate(dict(grid_best.params)),
    }
    for label, candidate in candidates.items():
        print(f"{label:12} {candidate.describe()}")
    options = replace(run.options, verify_rounds=args.rounds)
    with TrialRunner(str(run.profile.workload["source"]), options.device, options.trial_timeout_s,
                     options.memory_limit_bytes) as runner:
        compared = compare_interleaved(runner, [c.to_dict() for c in candidates.values()], options, None)
    if isinstance(compared, str):
        raise SystemExit(f"comparison failed: {compared}")
    samples = dict(zip(candidates, compared[0]))
    chosen_speedup = paired_speedup(samples["baseline"], samples["chosen"])
    grid_speedup = paired_speedup(samples["baseline"], samples["grid's best"])
    ratio = paired_speedup(samples["grid's best"], samples["chosen"])  # > 1: the chosen is faster
    print(f"\nchosen over baseline:      {chosen_speedup.describe()}")
    print(f"grid's best over baseline: {grid_speedup.describe()}")
    print(f"chosen / grid's best:      {ratio.describe()}")
    print(f"{'PASS' if ratio.speedup >= WITHIN else 'FAIL'}  the chosen setting is within 3% of the grid's best "
          f"(ratio {ratio.speedup:.3f} >= {WITHIN})")


if __name__ == "__main__":
    main()
