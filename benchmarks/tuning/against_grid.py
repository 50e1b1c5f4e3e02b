"""The configuration a tuning run chose, against the best setting of a full grid on the same
workload, re-measured interleaved (baseline, chosen, grid's best: round-robin in one worker).

    python benchmarks/tuning/against_grid.py --run results/<tpu-tune run> --grid-run results/<grid run>
    python benchmarks/tuning/against_grid.py --grid-run results/<grid run> --top 6   # is the grid's best the best?

Issue 13's target for examples/gpt.py training: the chosen setting's speed within 3% of the grid's
best (the ratio chosen / grid's best >= 0.97). The grid's best is its fastest feasible amortised
step, as the search ranks; both speedups over the baseline are printed with 95% intervals.
The grid measured each setting once, at its own moment: `--top K` re-measures its K fastest
settings interleaved too, which says whether its best is ahead of the others or within noise.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tpu_tuner.metrics.paired import paired_speedup
from tpu_tuner.runner.trial_runner import TrialRunner
from tpu_tuner.tuning import TuningResult
from tpu_tuner.tuning.search.tuning_trial import TuningTrial
from tpu_tuner.tuning.verify.interleaved import compare_interleaved

WITHIN = 0.97


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="the tuning run whose chosen config is checked")
    parser.add_argument(
        "--grid-run", type=Path, required=True, help="a run of the same workload made with --sampler grid"
    )
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument(
        "--top", type=int, default=1, help="re-measure the grid's K fastest settings (default 1: its best)"
    )
    args = parser.parse_args()

    grid = TuningResult.load(args.grid_run)
    feasible = [t for t in TuningTrial.all(grid.study.trials) if t.is_feasible and not t.is_repeat]
    ranked = sorted(feasible, key=lambda t: t.objective)[: max(1, args.top)]
    candidates = {"baseline": grid.space.to_candidate(grid.space.baseline_params())}
    if args.run is not None:
        run = TuningResult.load(args.run)
        candidates["chosen"] = run.verification.chosen
    for rank, trial in enumerate(ranked, start=1):
        candidates["grid's best" if rank == 1 else f"grid #{rank}"] = grid.space.to_candidate(dict(trial.params))
    table = {label: trial.value for label, trial in zip(list(candidates)[-len(ranked) :], ranked)}
    run = grid.options.runner
    with TrialRunner(
        str(grid.profile.workload["source"]), run.device, run.trial_timeout_s, grid.options.objective.memory_limit_bytes
    ) as runner:
        compared = compare_interleaved(runner, [c.to_dict() for c in candidates.values()], args.rounds, run, None)
    if isinstance(compared, str):
        raise SystemExit(f"comparison failed: {compared}")
    samples = dict(zip(candidates, compared[0]))
    print(f"{'setting':12} {'grid table':>10} {'interleaved median':>18}  speedup over the baseline (interleaved)")
    for label, candidate in candidates.items():
        listed = f"{table[label] * 1e3:8.1f} ms" if label in table else f"{'':>10}"
        median = sorted(samples[label])[len(samples[label]) // 2]
        over = "" if label == "baseline" else paired_speedup(samples["baseline"], samples[label]).describe()
        print(f"{label:12} {listed} {median * 1e3:15.1f} ms  {over}")
        print(f"{'':12} {candidate.describe()}")
    if "chosen" in samples:
        ratio = paired_speedup(samples["grid's best"], samples["chosen"])  # > 1: the chosen is faster
        print(f"\nchosen / grid's best: {ratio.describe()}")
        print(
            f"{'PASS' if ratio.speedup >= WITHIN else 'FAIL'}  the chosen setting is within 3% of the grid's best "
            f"(ratio {ratio.speedup:.3f} >= {WITHIN})"
        )


if __name__ == "__main__":
    main()
