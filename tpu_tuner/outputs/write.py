"""Writing a run folder: the one place that writes the files of a profile, a tuning run, a plan
and a bucketing study, under the names in `tpu_tuner.core.run_folder`.

The CLI and the Python API both call these, so `tpu-tune profile` and
``save_profile(tpu_tuner.profile(...))`` leave the same files, and the dashboard's collector
(which reads the same names) understands both. Each writer returns the names it wrote. The
heavy imports (matplotlib, the report renderers, torch through the results) happen inside the
writers, so that importing this module stays cheap.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpu_tuner.core import run_folder
from tpu_tuner.core.run_folder import new_run_dir, write_atomic

if TYPE_CHECKING:
    from tpu_tuner.bucketing.study import BucketResult
    from tpu_tuner.planner.plans.plan import PlanOptions, PlanResult
    from tpu_tuner.profiling.profile import Profile
    from tpu_tuner.tuning.run.tuning_result import TuningResult

log = logging.getLogger(__name__)


# --- profile ---------------------------------------------------------------------------------


def write_profile(run_dir: str | Path, profile: Profile) -> list[str]:
    """profile.json (every figure) and profile.md in `run_dir`."""
    from tpu_tuner.outputs.profile_report import render_markdown

    run_dir = Path(run_dir)
    write_atomic(run_dir / run_folder.PROFILE_JSON, profile.to_json())
    write_atomic(run_dir / run_folder.PROFILE_MD, render_markdown(profile))
    return [run_folder.PROFILE_JSON, run_folder.PROFILE_MD]


def save_profile(profile: Profile, out: str | Path = run_folder.RESULTS_DIR) -> Path:
    """A new run folder under `out` (``<model>-<timestamp>``) holding the profile; returns it."""
    run_dir = new_run_dir(out, profile.workload.name)
    write_profile(run_dir, profile)
    return run_dir


# --- tuning ----------------------------------------------------------------------------------


def write_tuning(result: TuningResult) -> list[str]:
    """The files of a finished tuning run in `result.run_dir`: profile.json, result.json,
    trials.csv, the plots, report.md, and last tuned_config.toml (whose presence tells the
    dashboard the run finished). run.json and study.db are written by the tuning loop."""
    from tpu_tuner.outputs.tuning_plots import write_plots
    from tpu_tuner.outputs.tuning_report import render_report

    run_dir = result.run_dir
    write_atomic(run_dir / run_folder.PROFILE_JSON, result.profile.to_json())
    if result.verified:
        write_atomic(run_dir / run_folder.RESULT_JSON, result.to_json())
    write_atomic(run_dir / run_folder.TRIALS_CSV, result.trials_dataframe().to_csv(index=False))
    plots = write_plots(result)
    write_atomic(run_dir / run_folder.REPORT_MD, render_report(result, plots))
    written = [run_folder.PROFILE_JSON, run_folder.TRIALS_CSV, *(p.name for p in plots.values()), run_folder.REPORT_MD]
    if not result.verified:
        # A worker that left the verification to another writes no recommendation of its own.
        return written
    result.best_config.save(run_dir / run_folder.TUNED_CONFIG)
    # In the order written: result.json came right after profile.json.
    return [written[0], run_folder.RESULT_JSON, *written[1:], run_folder.TUNED_CONFIG]


# --- plan ------------------------------------------------------------------------------------


def plan_run_dir(out: str | Path, model_file: str | Path, topology: str, preset: str | None = None) -> Path:
    """A new plan folder, ``<model>[_<preset>]-plan-<topology>-<timestamp>``; an ``hf:`` model is
    named by its config's folder, hub repository or model type."""
    from tpu_tuner.model.decoders.decoder import INLINE_PREFIX
    from tpu_tuner.model.workloads.hf_source import is_hf_source, parse

    if is_hf_source(model_file):
        stem = parse(model_file).name  # Path("hf:./Llama-3.1-70B").stem would be "Llama-3"
    else:
        stem = "decoder" if str(model_file).startswith(INLINE_PREFIX) else Path(model_file).stem
    name = stem + (f"_{preset}" if preset else "")
    return new_run_dir(out, name, f"plan-{topology.replace(':', '_')}")


def write_plan(run_dir: str | Path, result: PlanResult) -> list[str]:
    """plan.json, predicted_mfu.png, plan.md and, when a layout fits, sharding_config.toml."""
    from tpu_tuner.knobs.candidate import Candidate
    from tpu_tuner.knobs.tuned_config import TunedConfig
    from tpu_tuner.outputs.plan_report import render_markdown, write_plot

    run_dir = Path(run_dir)
    write_atomic(run_dir / run_folder.PLAN_JSON, json.dumps(result.to_dict(), indent=2, default=str))
    plot = write_plot(result, run_dir / run_folder.PLAN_PNG)
    write_atomic(run_dir / run_folder.PLAN_MD, render_markdown(result, plot, result.source or "MODEL.py", str(run_dir)))
    written = [run_folder.PLAN_JSON, run_folder.PLAN_PNG, run_folder.PLAN_MD]
    best = result.best
    if best is not None and best.prediction is not None:  # the best always has a prediction
        # The layout knob runs data x fsdp x tensor: a planned context axis is folded into fsdp
        # there (the axis that also splits the parameters), and the planned mesh kept beside it.
        # The mesh gives the TPU baseline its layout setting ([settings] layout, the knob a sharded
        # trial applies); [sharding] repeats it beside the placements the planner derived.
        TunedConfig(
            Candidate.baseline("tpu"),
            "tpu",
            provenance={
                "plan": str(run_dir / run_folder.PLAN_JSON),
                "topology": result.topology.name,
                "predicted_mfu": best.prediction.mfu,
                "predicted_step_s": best.prediction.step_seconds,
                "predicted_mfu_error_points": result.error_band.points if result.error_band else None,
            },
            sharding={
                "mesh": best.layout.without_context().mesh_shape(),
                "planned_mesh": best.layout.mesh_shape(),
                "placements": result.placements,
                "remat": best.remat,
                "gradient_accumulation_steps": best.accumulation,
                "per_device_batch_size": best.per_device_batch,
            },
        ).save(run_dir / run_folder.SHARDING_CONFIG)
        written.append(run_folder.SHARDING_CONFIG)
    return written


def with_plan_storage(options: PlanOptions, out: str | Path) -> PlanOptions:
    """A search's options with a storage where none is given: $TPU_TUNE_STORAGE, else the results
    folder's plans.db (the search's trials outlive a run folder: the same plan run again resumes)."""
    if not options.search.active or options.store.url is not None:
        return options
    from tpu_tuner.studies.storage import storage_from_environment

    Path(out).mkdir(parents=True, exist_ok=True)
    url = storage_from_environment() or f"sqlite:///{(Path(out) / run_folder.PLANS_DB).resolve()}"
    return replace(options, store=replace(options.store, url=url))


# --- buckets ---------------------------------------------------------------------------------


def write_buckets(run_dir: str | Path, result: BucketResult, model_file: str | Path | None = None) -> list[str]:
    """buckets.json, the two plots, buckets.md and bucket_config.toml (`model_file`, when given,
    is recorded in the config's provenance; else the workload's name)."""
    from tpu_tuner.knobs.candidate import Candidate
    from tpu_tuner.knobs.execution import compiled_with
    from tpu_tuner.knobs.tuned_config import TunedConfig
    from tpu_tuner.model.buckets.torchtpu_buckets import torchtpu_instructions
    from tpu_tuner.outputs.bucket_report import render_markdown, write_plots

    run_dir = Path(run_dir)
    write_atomic(run_dir / run_folder.BUCKETS_JSON, json.dumps(result.to_dict(), indent=2, default=str))
    plots = write_plots(result, run_dir)
    write_atomic(run_dir / run_folder.BUCKETS_MD, render_markdown(result, plots))
    bounds = list(result.chosen.strategy.bounds)
    provenance: dict[str, Any] = {
        "source": "tpu-tune buckets",
        "workload": str(model_file or result.workload),
        "steps": result.steps,
        "predicted_total_seconds": result.chosen.total_seconds,
        "oracle_seconds": result.oracle_seconds,
        "padding_waste": result.chosen.padding_waste,
        "cost_model": result.cost_model.describe(),
    }
    TunedConfig(
        Candidate(compiled_with(result.compile_backend)),
        result.device,
        provenance=provenance,
        bucketing={"buckets": bounds, "align": result.align, "torchtpu": torchtpu_instructions(bounds)},
    ).save(run_dir / run_folder.BUCKET_CONFIG)
    return [run_folder.BUCKETS_JSON, *plots, run_folder.BUCKETS_MD, run_folder.BUCKET_CONFIG]


def save_buckets(
    result: BucketResult, out: str | Path = run_folder.RESULTS_DIR, model_file: str | Path | None = None
) -> Path:
    """A new run folder under `out` (``<model>-buckets-<timestamp>``) holding the study; returns it."""
    run_dir = new_run_dir(out, result.workload, "buckets")
    write_buckets(run_dir, result, model_file)
    return run_dir


__all__ = [
    "plan_run_dir",
    "save_buckets",
    "save_profile",
    "write_buckets",
    "write_plan",
    "write_profile",
    "write_tuning",
]
