"""The planner's entry points that both plan and write run folders (`tpu-tune plan`, its
`--rank` over several slices, and `tpu_tuner.plan_to_folder`): the planner computes, the outputs
layer writes, and this module joins the two, as `api.py` does for tuning. Kept apart from `api.py`
so that planning imports neither torch nor the tuner (the planner's parent process stays light).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tpu_tuner.core import run_folder
from tpu_tuner.core.errors import TpuTuneError
from tpu_tuner.outputs.ranking_report import write_ranking
from tpu_tuner.outputs.write import plan_run_dir, with_plan_storage, write_plan
from tpu_tuner.planner.plans.plan import plan
from tpu_tuner.planner.plans.ranking import Ranking, ranked, slice_of, unplanned

if TYPE_CHECKING:
    from tpu_tuner.planner.plans.plan import PlanResult
    from tpu_tuner.planner.plans.plan_options import PlanOptions
    from tpu_tuner.planner.plans.prices import Price

log = logging.getLogger(__name__)


def plan_to_folder(
    model_file: str | Path,
    options: PlanOptions,
    out: str | Path = run_folder.RESULTS_DIR,
    progress: Callable[[str], None] | None = None,
) -> tuple[Path, PlanResult]:
    """Plan `model_file` into a new folder under `out`; returns (folder, result).

    The folder comes first: the compiler processes write libtpu's logs (start-up noise, stack
    dumps of compiler crashes) into its compiler.log rather than onto the terminal. A plan refused
    for bad input leaves no folder behind; one that failed otherwise keeps compiler.log when the
    compilers wrote anything (it says why).
    """
    new_root = not Path(out).exists()
    options = with_plan_storage(options, out)
    if options.store.url is not None:
        from tpu_tuner.studies.storage import check_storage

        check_storage(options.store.url)
    run_dir = plan_run_dir(out, model_file, options.target.topology, options.step.preset)
    log_file = run_dir / run_folder.COMPILER_LOG
    options = replace(options, compile=replace(options.compile, log_file=log_file))
    try:
        result = plan(model_file, options, progress=progress)
    except BaseException as exc:
        _drop_failed_plan(run_dir, log_file, bad_input=isinstance(exc, TpuTuneError))
        if new_root and not any(Path(out).iterdir()):  # the results folder this plan made, now empty
            Path(out).rmdir()
        raise
    write_plan(run_dir, result)
    return run_dir, result


def _drop_failed_plan(run_dir: Path, log_file: Path, bad_input: bool) -> None:
    if bad_input or not log_file.exists() or log_file.stat().st_size == 0:
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        log.warning("the compiler processes' output is in %s", log_file)


def rank_to_folder(
    model_file: str | Path,
    options: PlanOptions,
    topologies: list[str],
    prices: dict[str, Price],
    out: str | Path = run_folder.RESULTS_DIR,
    progress: Callable[[str], None] | None = None,
) -> tuple[Path, Ranking]:
    """Plan `model_file` on each of `topologies` with the same options (one plan folder each, inside
    a new ranking folder under `out`) and rank them; returns (ranking folder, ranking).

    A slice the planner refuses (no layout divides the model on it, ...) ranks with the slices
    where nothing fits, its refusal as why. When every slice is refused, the folder is removed and
    the first refusal raised: the input, not one slice, is at fault."""
    from tpu_tuner.planner.topology import parse_topology

    emit = progress or (lambda message: None)
    started = time.perf_counter()
    # One study storage for every slice, as a single plan keeps it: a ranking run again resumes each slice's search.
    options = with_plan_storage(options, out)
    parent = plan_run_dir(out, model_file, "ranking", options.step.preset)
    ranking = Ranking(
        source=str(model_file),
        workload="",
        preset=options.step.preset,
        slices=[],
        prices={g: asdict(p) for g, p in sorted(prices.items())},
        topologies=list(topologies),
    )
    write_ranking(parent, ranking)  # marks the folder as a ranking while its slices are planned
    refusals: list[TpuTuneError] = []
    for number, topology in enumerate(topologies, 1):
        emit(f"=== {topology} ({number} of {len(topologies)}) ===")
        parsed = parse_topology(topology)
        price = prices.get(parsed.chip.generation)
        try:
            run_dir, result = plan_to_folder(
                model_file, replace(options, target=replace(options.target, topology=topology)), parent, progress
            )
        except TpuTuneError as exc:
            refusals.append(exc)
            emit(f"{topology}: not planned: {exc}")
            ranking.slices.append(
                unplanned(topology, parsed.chip.generation, parsed.chips, parsed.devices, f"not planned: {exc}", price)
            )
        else:
            ranking.workload = result.workload
            plan = json.loads((run_dir / run_folder.PLAN_JSON).read_text())
            ranking.slices.append(slice_of(plan, price, run_dir.name))
        ranking.slices = ranked(ranking.slices)
        ranking.seconds = time.perf_counter() - started
        write_ranking(parent, ranking)
    if len(refusals) == len(topologies):
        shutil.rmtree(parent, ignore_errors=True)
        raise refusals[0]
    return parent, ranking


__all__ = ["plan_to_folder", "rank_to_folder"]
