"""A tuning study on N ranks, summarised per layout: what each layout's best setting measured,
what failed or was given up and why, and the verified result.

    python benchmarks/parallel/sharded_study.py --model examples/llama.py --nproc 2 [--plan PLAN_DIR] [--trials N]
    python benchmarks/parallel/sharded_study.py --run results/<run>/      # summarise a finished run

Runs `tpu_tuner.tune` with ``nproc`` (every trial a process group of N ranks, PyTorch's launcher,
gloo on CPU), then prints, per layout: settings measured, failed and rejected, the best feasible
amortised step and its settings, the largest accuracy error among its feasible trials; then the
verification (baseline against best, interleaved on the same ranks).
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

import optuna

from tpu_tuner.studies import records
from tpu_tuner.tuning.options.tune_options import OutputOptions, RunnerOptions, SearchOptions
from tpu_tuner.tuning.search.tuning_trial import TuningTrial


def summarise(study: optuna.Study) -> list[str]:
    """One line per layout, and one per distinct failure or rejection reason of the layouts."""
    by_layout: dict[str, list[TuningTrial]] = collections.defaultdict(list)
    for trial in TuningTrial.all(study.get_trials(deepcopy=False)):
        if "layout" in trial.params and not trial.is_repeat:
            by_layout[trial.params["layout"]].append(trial)
    lines = []
    for layout, trials in by_layout.items():
        measured = [t for t in trials if t.measured]
        feasible = [t for t in measured if t.is_feasible]
        failed = [t for t in measured if t.state == optuna.trial.TrialState.FAIL]
        rejected = [t for t in trials if str(t.rejected_by or "").startswith("sharding")]
        best = min(feasible, key=lambda t: t.objective) if feasible else None
        line = (
            f"{layout}: {len(measured)} measured, {len(feasible)} feasible, {len(failed)} failed, "
            f"{len(rejected)} given up by the sharding agent"
        )
        if best is not None:
            worst = max(float(t.stored.get(records.ACCURACY_ERROR, 0.0)) for t in feasible)
            others = {k: v for k, v in best.params.items() if k != "layout"}
            line += (
                f"; best {best.objective * 1e3:.1f} ms amortised (trial {best.number}, {others}); max error {worst:.1e}"
            )
        lines.append(line)
        reasons = collections.Counter(str(t.failure.message if t.failure else "")[:140] for t in failed)
        lines += [f"    failed x{count}: {reason}" for reason, count in reasons.most_common(3)]
        if rejected:
            lines.append(f"    given up: {str(rejected[0].rejected_by)[:200]}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="examples/llama.py")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--plan", type=Path)
    parser.add_argument("--trials", type=int)
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--run", type=Path, help="summarise this finished run folder instead of tuning")
    args = parser.parse_args()

    from tpu_tuner.tuning.run.tuning_result import TuningResult

    if args.run is not None:
        result = TuningResult.load(args.run)
    else:
        from tpu_tuner.api import tune
        from tpu_tuner.tuning.options.tune_options import TuneOptions

        result = tune(
            args.model,
            TuneOptions(
                search=SearchOptions(trials=args.trials, plan=args.plan),
                runner=RunnerOptions(nproc=args.nproc),
                outputs=OutputOptions(out=args.out),
            ),
        )
    print(f"{result.run_dir}: {result.options.runner.nproc} ranks, {result.profile.workload.get('name')}")
    for line in summarise(result.study):
        print(line)
    for finding in result.findings.get("sharding", []):
        print(f"sharding agent: {finding}")
    print(f"verification: {result.verification.message} -> {result.verification.chosen.describe()}")


if __name__ == "__main__":
    main()
