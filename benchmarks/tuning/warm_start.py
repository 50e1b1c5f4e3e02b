"""Warm start: measured trials to reach within 3% of the best, cold against warm, on a second
model of the same family (issue 15).

Two measured runs, made once (``--measure``) and kept in a folder outside the repository:

* the *earlier run*: a normal TPE tuning run of the first model (examples/gpt.py, d_model 256);
* the *grid run*: every valid setting of the second model (a copy of examples/gpt.py at another
  d_model, 128 by default) measured once with the real tuning loop (``--sampler grid``).

Both use one reduced space (written next to them, ``space.toml``: execution x matmul precision x
autocast x optimizer implementation x micro-batches 1/2) and the same batch and sequence length,
so that a whole grid of the second model costs minutes, not hours, on a 2-core host.

The comparison is a replay, as benchmarks/tuning/search_efficiency.py does: the real search loop
(`run_search`, the grid run's space, profile, agents and budget rule) runs for each sampler seed,
and every trial is answered from the grid's table, so cold and warm over many seeds cost no new
measurement. *Cold* is what ``tpu-tune --cold`` runs: the baseline, the agents' seeds, TPE.
*Warm* is the same plus the seeds `find_warm_seeds` returns for the second model from a results
folder that holds only the earlier run, enqueued after the baseline by `enqueue_seeds` as
tpu-tune does. The count is measured trials (not rejected, not a repeat answered from an earlier
trial) until the best feasible amortised step is within 3% of the grid's best. Where the
earlier run's verified choice (its race winner, result.json) is another setting than the seed
offered (the search's fastest trial), that choice is replayed as the warm seed too.

`--earlier-run` and `--grid-run` take any finished pair, e.g. a default-space run of a GPT copy
at d_model 128 and the default-space grid of examples/gpt.py (with ``--reprofile``, as
search_efficiency.py runs that grid).

    python benchmarks/tuning/warm_start.py --measure --bench /work/bench/warm-start     # measures both runs
    python benchmarks/tuning/warm_start.py --earlier-run DIR --grid-run DIR [--seeds 20] [--budget N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import optuna
from search_efficiency import WITHIN, TableRunner, _measured, best_feasible, label, replay, trials_to_target

from tpu_tuner import TuneOptions, TuningResult, tune
from tpu_tuner.runner.requests import MeasureRequest
from tpu_tuner.tuning.options.tune_options import ObjectiveOptions, OutputOptions, RunnerOptions, SearchOptions
from tpu_tuner.tuning.run.run_setup import prepare_agents
from tpu_tuner.tuning.search.budget import search_budget
from tpu_tuner.tuning.search.warm_start import WarmSeed, find_warm_seeds
from tpu_tuner.tuning.search.workload_features import features_of

REPO = Path(__file__).resolve().parents[2]

SPACE = """\
# benchmarks/tuning/warm_start.py: a reduced training-step space for the GPT family on CPU
[space]
name = "warm-start-gpt"

[[param]]
name = "execution"
agent = "compile"
choices.cpu = ["eager", "aot_eager", "inductor"]

[[param]]
name = "matmul_precision"
agent = "precision"
choices.cpu = ["highest", "high", "medium"]

[[param]]
name = "autocast"
agent = "precision"
choices.cpu = ["none", "bfloat16"]

[[param]]
name = "optimizer_impl"
agent = "compile"
choices.cpu = ["default", "foreach", "fused"]

[[param]]
name = "micro_batches"
agent = "memory"
choices.cpu = ["1", "2"]
"""


def write_model(folder: Path, width: int) -> Path:
    """examples/gpt.py at another d_model (its own file: another sha256, as another model would be)."""
    text = (REPO / "examples" / "gpt.py").read_text()
    assert "d_model: int = 256" in text
    path = folder / f"gpt_d{width}.py"
    path.write_text(text.replace("d_model: int = 256", f"d_model: int = {width}"))
    return path


def measure(bench: Path, first_width: int, second_width: int, batch: int, seq: int, trials: int) -> tuple[Path, Path]:
    """The earlier run (TPE, first model) and the grid run (second model), in `bench`."""
    bench.mkdir(parents=True, exist_ok=True)
    space = bench / "space.toml"
    space.write_text(SPACE)
    models = bench / "models"
    models.mkdir(exist_ok=True)
    first = REPO / "examples" / "gpt.py" if first_width == 256 else write_model(models, first_width)
    second = write_model(models, second_width)

    def progress(event) -> None:
        # The load average: above ~1 (this run's own worker), something else ran alongside.
        print(f"[{event.phase} | {event.elapsed:6.0f} s | load {os.getloadavg()[0]:.2f}] {event.message}", flush=True)

    runner = RunnerOptions(batch_size=batch, seq_len=seq)
    started = time.perf_counter()
    earlier = tune(
        first,
        TuneOptions(
            search=SearchOptions(trials=trials, space=space, warm_start=False),
            objective=ObjectiveOptions(verify_rounds=4),
            runner=runner,
            outputs=OutputOptions(out=bench / "earlier"),
        ),
        progress,
    )
    print(f"earlier run: {earlier.run_dir} ({time.perf_counter() - started:.0f} s)", flush=True)
    started = time.perf_counter()
    grid = tune(
        second,
        TuneOptions(
            search=SearchOptions(sampler="grid", trials=100_000, space=space, warm_start=False),
            objective=ObjectiveOptions(verify_rounds=2),
            runner=runner,
            outputs=OutputOptions(out=bench / "grid"),
        ),
        progress,
    )
    print(f"grid run: {grid.run_dir} ({time.perf_counter() - started:.0f} s)", flush=True)
    return earlier.run_dir, grid.run_dir


def warm_seeds_for(grid: TuningResult, earlier_run: Path) -> list[WarmSeed]:
    """What `tpu-tune` would enqueue for the grid's workload with only `earlier_run` in its
    results folder (a temporary folder holding a link to it)."""
    fingerprint = json.loads((grid.run_dir / "run.json").read_text())["fingerprint"]
    with tempfile.TemporaryDirectory() as results_dir:
        (Path(results_dir) / earlier_run.resolve().name).symlink_to(earlier_run.resolve(), target_is_directory=True)
        return find_warm_seeds(
            grid.space,
            features_of(grid.profile, fingerprint),
            storage=None,
            results_dir=Path(results_dir),
            exclude_study=grid.study.study_name,
        )


def _here(runner: TableRunner, grid: TuningResult, seed: WarmSeed) -> str:
    """What the grid measured for a seed's setting."""
    value = runner.run(MeasureRequest(candidate=grid.space.to_candidate(seed.params).to_dict()))
    m = value.value if value.ok else None
    return (
        f"{m.amortised_step(grid.options.objective.planned_steps) * 1e3:.2f} ms here"
        if m is not None
        else "failed here"
    )


def _verified_choice(grid: TuningResult, earlier: TuningResult) -> WarmSeed | None:
    """The earlier run's verified choice as a warm seed for the grid's space, or None (not
    significant, the baseline, or not a setting of this space)."""
    v = earlier.verification
    if not v.chosen_is_best:  # not significant: the run recommends its baseline
        return None
    params = grid.space.complete(grid.space.to_params(v.chosen))
    if params == grid.space.complete(grid.space.baseline_params()) or grid.space.to_candidate(params) != v.chosen:
        return None
    return WarmSeed(
        params=params,
        source=f"run {earlier.run_dir} (verified choice)",
        match="replayed by hand",
        distance=0.0,
        objective_s=0.0,
        speedup=v.speedup.speedup if v.speedup else None,
        verified=True,
        trial=v.best_trial,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", action="store_true", help="measure the earlier run and the grid run first")
    parser.add_argument(
        "--bench",
        type=Path,
        default=Path("/work/bench/warm-start"),
        help="where --measure keeps its runs (outside the repository)",
    )
    parser.add_argument("--earlier-run", type=Path, help="a finished run of the first model")
    parser.add_argument("--grid-run", type=Path, help="a finished --sampler grid run of the second model")
    parser.add_argument("--first-width", type=int, default=256)
    parser.add_argument("--second-width", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--earlier-trials", type=int, default=12)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--budget", type=int, help="measured trials per replay (default: tpu-tune's automatic budget)")
    parser.add_argument(
        "--reprofile",
        action="store_true",
        help="profile the grid's workload again with this version and let the agents (and the warm "
        "start's features) read that profile, as search_efficiency.py --reprofile does",
    )
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    if args.measure:
        args.earlier_run, args.grid_run = measure(
            args.bench, args.first_width, args.second_width, args.batch_size, args.seq_len, args.earlier_trials
        )
    if args.earlier_run is None or args.grid_run is None:
        parser.error("give --earlier-run and --grid-run, or --measure")
    grid = TuningResult.load(args.grid_run)
    earlier = TuningResult.load(args.earlier_run)
    if args.reprofile:
        from tpu_tuner.profiling import profile

        grid.profile = profile(
            grid.profile.workload["source"],
            batch_size=grid.options.runner.batch_size,
            seq_len=grid.options.runner.seq_len,
            settings=grid.options.runner.trial_settings,
        )
        print(f"agents read a fresh profile of {grid.profile.workload['source']}")
    runner = TableRunner(grid.study)
    measured = _measured(grid.study)
    best = best_feasible(grid.study)
    if best is None:
        raise SystemExit(f"{args.grid_run}: no feasible measured setting")
    target = best * WITHIN
    agents, _, _ = prepare_agents(TuneOptions(search=SearchOptions(agents=grid.options.search.agents)), grid.profile)
    budget = args.budget or search_budget(None, "tpe", grid.space, agents).trials
    best_trial = next(t for t in measured if t.value == best)
    print(
        f"earlier run {args.earlier_run}: {earlier.profile.workload.get('name')} "
        f"({earlier.profile.flops.total_parameters / 1e6:.2f}M parameters), best "
        f"{earlier.verification.chosen.describe()}: {earlier.verification.message}"
    )
    print(
        f"grid run {args.grid_run}: {grid.profile.workload.get('name')} "
        f"({grid.profile.flops.total_parameters / 1e6:.2f}M parameters), {grid.profile.workload.get('step')}; "
        f"{len(measured)} settings measured"
    )
    print(
        f"grid's best {best * 1e3:.2f} ms amortised ({label(best_trial)}); "
        f"target within 3%: <= {target * 1e3:.2f} ms; budget {budget} measured trials"
    )
    ranked = sorted((t for t in measured if t.value is not None and t.feasible), key=lambda t: t.value)
    within = [t for t in ranked if t.value <= target]
    print(f"settings of the grid within 3% of its best: {len(within)} of {len(measured)}")

    warm = warm_seeds_for(grid, args.earlier_run)
    for seed in warm:
        print(f"warm seed: {seed.params} from {seed.describe()}; {_here(runner, grid, seed)}")
    if not warm:
        print("warm start found no seed: warm and cold are the same search")

    starts: list[tuple[str, list[WarmSeed]]] = [("cold", []), ("warm", warm)]
    verified = _verified_choice(grid, earlier)
    if warm and verified is not None and verified.params not in [w.params for w in warm]:
        print(
            f"the earlier run's verified choice is another setting: {verified.params}; "
            f'{_here(runner, grid, verified)}; replayed as the warm seed too ("warm*")'
        )
        starts.append(("warm*", [verified, *warm[1:]]))
    for agent_seeds in (True, False):
        title = "with the agents' seeds (as tpu-tune runs)" if agent_seeds else "without the agents' seeds"
        print(f"\n{title}: {args.seeds} TPE seeds each, budget {budget}:")
        print(
            f"{'start':6} {'reached':>8} {'median':>7} {'worst':>6} {'best/grid at budget (mean, worst)':>36}  "
            "trials to target per seed"
        )
        for name, seeds in starts:
            _compare(grid, runner, args.seeds, budget, seeds, target, best, name, agent_seeds)


def _compare(
    grid: TuningResult,
    runner: TableRunner,
    n_seeds: int,
    budget: int,
    warm: list[WarmSeed],
    target: float,
    best: float,
    name: str,
    agent_seeds: bool,
) -> None:
    """One row: trials to target over `n_seeds` sampler seeds, and best/grid at the budget."""
    counts, gaps = [], []
    for seed in range(n_seeds):
        study = replay(grid, runner, "tpe", seed, budget, agent_seeds, warm)
        counts.append(trials_to_target(study, target))
        found = best_feasible(study)
        gaps.append(found / best if found is not None else float("inf"))
    reached = [c for c in counts if c is not None]
    summary = f"{statistics.median(reached):7.1f} {max(reached):6d}" if reached else f"{'-':>7} {'-':>6}"
    print(
        f"{name:6} {len(reached):>4}/{len(counts):<3} {summary} "
        f"{f'{statistics.mean(gaps):.3f}x, {max(gaps):.3f}x':>36}  {counts}"
    )


if __name__ == "__main__":
    main()
