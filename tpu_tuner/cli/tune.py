"""`tpu-tune tune` (also `tpu-tune MODEL.py`): search, verify, write a tuned config.

Every flag sets one `TuneOptions` keyword (its `dest`), and takes its default from the section
that holds it: the defaults are stated once, in tuning/options.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tpu_tuner.cli.common import add_run_args, default_of, device_or_none
from tpu_tuner.core.units import parse_duration
from tpu_tuner.studies.storage import keeps_journal
from tpu_tuner.tuning.options import (
    KEYWORDS,
    SAMPLERS,
    ObjectiveOptions,
    RunnerOptions,
    SearchOptions,
    StoreOptions,
    TuneOptions,
)

NAME = "tune"
HELP = "search eager/compile mode and precision with Optuna; verify the win; write a tuned config"
DESCRIPTION = "Tune a model file (also: tpu-tune MODEL.py)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The tune command's flags, their defaults read from the options' sections."""
    add_run_args(parser)
    search, objective = SearchOptions, ObjectiveOptions
    parser.add_argument(
        "--trials",
        type=int,
        default=default_of(search, "trials"),
        help="settings to measure, baseline and seeds included; repeats and rejections are free "
        "(default: 20%% of the settings the agents would measure, 12 to 48; a grid: all of them)",
    )
    parser.add_argument(
        "--time-budget",
        metavar="DURATION",
        default=_budget_text(default_of(search, "time_budget_s")),
        help="the whole run's clock: search, race and verification fit in it, e.g. 10m, 90s, 1h30m; "
        "none: no clock, the trial budget alone (default %(default)s)",
    )
    parser.add_argument(
        "--no-prune",
        dest="prune",
        action="store_false",
        help="measure every trial to the end, however far behind the best its first steps are",
    )
    parser.add_argument(
        "--timeout",
        dest="timeout_s",
        metavar="TIMEOUT",
        type=float,
        default=default_of(search, "timeout_s"),
        help="stop starting trials after this many seconds (the search alone; --time-budget counts the whole run)",
    )
    parser.add_argument(
        "--sampler",
        choices=SAMPLERS,
        default=default_of(search, "sampler"),
        help="Optuna sampler (default %(default)s)",
    )
    parser.add_argument(
        "--seed", type=int, default=default_of(search, "seed"), help="sampler seed (default %(default)s)"
    )
    parser.add_argument(
        "--space", default=default_of(search, "space"), help="search space: a name in search_spaces/ or a TOML path"
    )
    parser.add_argument(
        "--steps",
        dest="planned_steps",
        metavar="STEPS",
        type=int,
        default=default_of(objective, "planned_steps"),
        help="steps of the run you plan; compile time is spread over them (default %(default)s)",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=default_of(objective, "tolerance"),
        help="largest relative error against fp32 eager a config may have (default %(default)g)",
    )
    parser.add_argument(
        "--trial-timeout",
        dest="trial_timeout_s",
        metavar="TRIAL_TIMEOUT",
        type=float,
        default=default_of(RunnerOptions, "trial_timeout_s"),
        help="seconds before a trial is killed (default %(default)g)",
    )
    parser.add_argument(
        "--trial-memory-gb",
        type=float,
        help="address-space limit of the trial worker, GiB; also the "
        "study's memory constraint (a trial whose measured peak memory exceeds it is infeasible)",
    )
    parser.add_argument(
        "--verify-rounds",
        type=int,
        default=default_of(objective, "verify_rounds"),
        help="interleaved rounds of the final comparison (default %(default)s)",
    )
    parser.add_argument(
        "--storage",
        default=default_of(StoreOptions, "url"),
        help="Optuna storage URL, e.g. postgresql://user@host/db (default: $TPU_TUNE_STORAGE, else "
        "SQLite: the run folder's study.db, or with --study the results folder's studies.db); a "
        "password may also come from PGPASSWORD or ~/.pgpass",
    )
    parser.add_argument(
        "--study",
        metavar="NAME",
        default=default_of(StoreOptions, "study"),
        help="join the study NAME in the storage (created by its first worker): every worker given "
        "the same storage and name works on one search",
    )
    parser.add_argument(
        "--heartbeat-interval",
        dest="heartbeat_interval_s",
        type=int,
        metavar="S",
        default=default_of(StoreOptions, "heartbeat_interval_s"),
        help="seconds between a running trial's heartbeats (default %(default)s)",
    )
    parser.add_argument(
        "--grace-period",
        dest="grace_period_s",
        type=int,
        metavar="S",
        default=default_of(StoreOptions, "grace_period_s"),
        help="seconds without a heartbeat before a trial's worker counts as lost and its setting is "
        "queued again (default: three heartbeats)",
    )
    parser.add_argument(
        "--cold", action="store_true", help="no warm start: do not enqueue the best settings of earlier studies first"
    )
    parser.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        default=default_of(StoreOptions, "resume"),
        help="continue the study of an earlier run folder",
    )
    parser.add_argument(
        "--lengths",
        dest="lengths_file",
        metavar="LENGTHS",
        type=Path,
        default=default_of(objective, "lengths_file"),
        help="input length sample (CSV or one number a line; default: the file's sample_lengths()); "
        "each trial's objective then includes its best shape buckets",
    )
    parser.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        default=default_of(RunnerOptions, "nproc"),
        help="run every trial on N ranks of this host, one process per device, and search how they "
        "share the step, training or inference (data / fsdp / tensor layouts; default %(default)s)",
    )
    add_host_args(parser)
    parser.add_argument(
        "--plan",
        type=Path,
        metavar="PLAN_DIR",
        default=default_of(search, "plan"),
        help="with --nproc: seed the layouts a `tpu-tune plan` folder ranked first (mapped onto N ranks)",
    )
    parser.add_argument(
        "--max-buckets",
        type=int,
        default=default_of(objective, "max_buckets"),
        help="most compiled shapes when inputs vary (default %(default)s)",
    )
    parser.add_argument(
        "--bucket-align",
        type=int,
        default=default_of(objective, "bucket_align"),
        help="bucket bounds are multiples of this (default %(default)s)",
    )


def add_host_args(parser: argparse.ArgumentParser) -> None:
    """The flags of trials that span hosts (docs/sharding.md, "Trials across hosts")."""
    runner = RunnerOptions
    parser.add_argument(
        "--nnodes",
        type=int,
        metavar="M",
        default=default_of(runner, "nnodes"),
        help="run every trial on M hosts of --nproc ranks each: the same command on every host, "
        "with --rdzv and --study (default %(default)s)",
    )
    parser.add_argument(
        "--rdzv",
        metavar="HOST:PORT",
        default=default_of(runner, "rdzv"),
        help="with --nnodes: the rendezvous every host joins (torch's c10d), served by the agent on "
        "HOST, which drives the study",
    )
    parser.add_argument(
        "--node-rank",
        type=int,
        metavar="K",
        default=default_of(runner, "node_rank"),
        help="with --nnodes: this host's place, 0 to M-1 (e.g. $JOB_COMPLETION_INDEX; default: the "
        "rendezvous assigns it, the host of --rdzv getting 0)",
    )
    parser.add_argument(
        "--rdzv-timeout",
        dest="rdzv_timeout_s",
        type=float,
        metavar="S",
        default=default_of(runner, "rdzv_timeout_s"),
        help="seconds the hosts wait for each other at the rendezvous (default %(default)g)",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        metavar="R",
        default=default_of(runner, "max_restarts"),
        help="after a host is lost, meet again (waiting for it to be started again) up to R times; "
        "else the run stops (default %(default)s)",
    )
    parser.add_argument(
        "--tensor-across-hosts",
        action="store_true",
        help="with --nnodes: also search tensor sizes that do not divide --nproc (tensor groups spanning hosts)",
    )


def _budget_text(seconds: float | None) -> str:
    """The default --time-budget as the flag spells it ("4m")."""
    if seconds is None:
        return "none"
    return f"{seconds / 60:g}m" if seconds % 60 == 0 else f"{seconds:g}s"


def options_from(args: argparse.Namespace) -> TuneOptions:
    """The options the flags name: each flag's `dest` is its keyword; the rest are converted."""
    keywords: dict[str, Any] = {name: value for name, value in vars(args).items() if name in KEYWORDS}
    gib = args.trial_memory_gb
    keywords.update(
        device=device_or_none(args.device),
        warm_start=not args.cold,
        time_budget_s=parse_duration(args.time_budget),
        memory_limit_bytes=int(gib * 1024**3) if gib else None,
        trial_settings=None,
    )  # the default, built by tune(): building it here would import torch
    return TuneOptions(**keywords)


def run(args: argparse.Namespace) -> int:
    """Tune, printing progress; then the baseline against the tuned setting, and where it is."""
    from tpu_tuner.core.credentials import redact, without_password
    from tpu_tuner.studies.storage import storage_from_environment

    # Bad options, space or storage are refused here, in well under a second: before torch and
    # optuna are imported, before any model runs and before a run folder exists.
    options = options_from(args).preflight()
    from tpu_tuner.api import tune
    from tpu_tuner.cli.tune_progress import ProgressLines
    from tpu_tuner.core.units import ms
    from tpu_tuner.knobs.candidate import Candidate

    show = ProgressLines()
    if options.runner.nnodes > 1:
        from tpu_tuner.api import tune_across_hosts
        from tpu_tuner.tuning.result import TuningResult

        outcome = tune_across_hosts(args.model_file, options, progress=show)
        if not isinstance(outcome, TuningResult):  # a follower: the driver has the results
            print(f"hosts     {outcome.reason} ({outcome.jobs} job(s) ran on this host's ranks)")
            return 1 if outcome.failed else 0
        result = outcome
    else:
        result = tune(args.model_file, options, progress=show)
    v = result.verification
    print()
    url = options.store.url
    if not result.verified:
        print(f"search    done: {v.message}")
        print(f"results   {result.run_dir}/ (report.md, trials.csv: this worker's view of the study)")
        storage = "" if url is None or url == storage_from_environment() else f" --storage {without_password(url)}"
        print(
            f"status    tpu-tune study status{storage} --study {result.study.study_name}"
            + (f" --out {options.outputs.out}" if url is None else "")
        )
        return 0
    compared = result.compared
    base, chosen = compared.baseline, compared.tuned
    if base is not None and chosen is not None:
        planned = options.objective.planned_steps
        print(
            f"baseline  steady step {ms(base.step_median)}, amortised {ms(base.amortised_step(planned))}, "
            f"MFU {base.mfu:.1%}  ({Candidate.from_dict(base.candidate).describe()})"
        )
        print(
            f"tuned     steady step {ms(chosen.step_median)}, amortised {ms(chosen.amortised_step(planned))}, "
            f"MFU {chosen.mfu:.1%}  ({v.chosen.describe()})"
        )
        if compared.from_window:
            print(
                f"          (steady step: median of the {compared.rounds} rounds of the interleaved verification "
                f"window; amortised adds the search's compile time / {planned} planned steps)"
            )
        else:
            print(
                f"          (from the search: {compared.why_search}; "
                f"amortised = steady step + compile time / {planned} planned steps)"
            )
        print(f"accuracy  relative error {chosen.accuracy_error:.2e} (tolerance {options.objective.tolerance:g})")
    print(f"speedup   {v.message}")
    if v.speedup is not None:
        print("          (steady step against steady step, re-measured interleaved; compile time is not in it)")
        if compared.from_window and compared.ratio is not None and v.chosen_is_best:
            # Two estimators of one window: close, not identical.
            print(f"          (geometric mean of the per-round ratios; the medians above give {compared.ratio:.2f}x)")
    print(f"results   {result.run_dir}/ (tuned_config.toml, report.md, trials.csv, plots)")
    stored = str(result.best_config.provenance["study"]["storage"])
    # A PostgreSQL journal is not opened by URL (docs/many-workers.md); an in-memory study has none.
    if "://" in stored and not keeps_journal(stored):
        print(f"dashboard optuna-dashboard {redact(stored)}")
    return 0
