"""Search efficiency: TPE against random and grid search at equal trial budgets, several seeds.

Measuring every sampler x seed on the real workload would cost hours of compiles, so the
benchmark is tabular (as HPOBench-style benchmarks are): it measures the *full grid* of the
search space once on the workload with the real tuning loop, then replays the real search loop
(the same seeds, agents, rejections and budget rules) for each sampler and seed, answering each
trial from that table. It reports how many measured trials each needs before its best feasible
setting is within 3% of the grid's best.

    python benchmarks/search_efficiency.py --grid-run results/<a run made with --sampler grid>
    python benchmarks/search_efficiency.py --example gpt      # measures the grid first (minutes)
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import optuna

from _runs import load_study

from tpu_tuner.agents import load_agents
from tpu_tuner.candidate import Candidate
from tpu_tuner.runner.measurement import TrialFailure
from tpu_tuner.runner.pool import JobResult
from tpu_tuner.search.space import SearchSpace
from tpu_tuner.tuning import TuneOptions, trial_attrs, tune
from tpu_tuner.tuning.study import build_sampler, enqueue_seeds, run_search

REPO = Path(__file__).resolve().parent.parent
WITHIN = 1.03


class TableRunner:
    """Answers "measure" jobs from a grid run's measurements instead of running the workload."""

    def __init__(self, study: optuna.Study) -> None:
        self.table: dict[str, JobResult] = {}
        for trial in study.trials:
            m = trial_attrs.measurement_of(trial)
            key = trial.user_attrs.get("candidate")
            if m is not None:
                self.table[_key(m.candidate)] = JobResult(value=m)
            elif trial.user_attrs.get("failure_kind") and key:
                self.table[_key(key)] = JobResult(failure=TrialFailure(trial.user_attrs["failure_kind"], "from table"))
        self.workers_started = 0

    def run(self, job, payload, options, env=None, timeout_s=None) -> JobResult:  # noqa: ANN001
        return self.table.get(_key(payload), JobResult(failure=TrialFailure("error", "not in the grid table")))


def _key(candidate: dict) -> str:
    return repr(sorted(Candidate.from_dict(candidate).to_dict().items()))


def trials_to_target(study: optuna.Study, target: float) -> int | None:
    """Measured trials until the best feasible amortised step is within `target`."""
    measured = 0
    for trial in sorted(study.trials, key=lambda t: t.number):
        if "repeat_of" in trial.user_attrs or "rejected_by" in trial.user_attrs:
            continue
        measured += 1
        if trial_attrs.is_feasible(trial) and trial.value is not None and trial.value <= target:
            return measured
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid-run", type=Path, help="a finished run made with --sampler grid")
    parser.add_argument("--example", default="gpt", help="example to measure the grid on when no --grid-run")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--budget", type=int, default=12, help="trials per replay (the default --trials)")
    args = parser.parse_args()

    if args.grid_run is None:
        space = SearchSpace.load("default", "cpu")
        result = tune(REPO / "examples" / f"{args.example}.py",
                      TuneOptions(sampler="grid", trials=space.size(), out=REPO / "results", verify_rounds=4))
        args.grid_run = result.run_dir
    grid_study = load_study(args.grid_run)
    runner = TableRunner(grid_study)
    device_kind = "cpu"
    space = SearchSpace.load("default", device_kind)
    feasible = [t.value for t in grid_study.trials if trial_attrs.is_feasible(t) and "repeat_of" not in t.user_attrs]
    best = min(feasible)
    target = best * WITHIN
    print(f"grid table: {len(runner.table)} measured settings from {args.grid_run}; best amortised step "
          f"{best * 1e3:.1f} ms; target within 3%: <= {target * 1e3:.1f} ms")
    agents = load_agents(["compile", "precision"], device_kind)
    for seeded in (True, False):
        title = "with the agents' seeds (as tpu-tune runs)" if seeded else "samplers alone (no seeds)"
        print(f"\n{title}: measured trials to within 3% of the grid's best (budget {args.budget}, {args.seeds} seeds)")
        print(f"{'sampler':8} {'reached':>8} {'median':>7} {'mean':>6} {'worst':>6}  per seed")
        for sampler in ("tpe", "random", "grid"):
            counts: list[int | None] = []
            for seed in range(args.seeds):
                options = TuneOptions(sampler=sampler, seed=seed, trials=args.budget)
                study = optuna.create_study(direction="minimize", sampler=build_sampler(options, space))
                if seeded and sampler != "grid":
                    enqueue_seeds(study, space, agents, None)  # the loop's seeds: baseline, agents' guesses
                run_search(study, space, agents, runner, {}, options, lambda event: None, time.perf_counter())
                counts.append(trials_to_target(study, target))
            reached = [c for c in counts if c is not None]
            summary = (f"{statistics.median(reached):7.1f} {statistics.mean(reached):6.1f} {max(reached):6d}"
                       if reached else f"{'-':>7} {'-':>6} {'-':>6}")
            print(f"{sampler:8} {len(reached):>4}/{len(counts):<3} {summary}  {counts}")


if __name__ == "__main__":
    main()
