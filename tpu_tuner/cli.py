"""The `tpu-tune` command line. The only module that prints to the terminal or exits."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from tpu_tuner.knobs.autocast import AUTOCAST_DTYPES
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.matmul_precision import MATMUL_PRECISIONS
from tpu_tuner.core.errors import TpuTuneError
from tpu_tuner.tuning.options import HEARTBEAT_INTERVAL_S

log = logging.getLogger("tpu_tuner.cli")


def _add_run_args(parser: argparse.ArgumentParser) -> None:
    """Arguments every command that runs the model shares: the file, device, sizes, output."""
    parser.add_argument("model_file", type=Path, help="a model file (native contract or benchmark convention)")
    parser.add_argument("--device", default="auto", help="auto (default), tpu, cuda or cpu")
    parser.add_argument("--batch-size", type=int, help="batch size (default: the file's BATCH_SIZE)")
    parser.add_argument("--seq-len", type=int, help="sequence length (default: the file's SEQ_LEN)")
    parser.add_argument("--out", type=Path, default=Path("results"), help="results folder (default: results/)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tpu-tune",
        description="Profile and tune PyTorch models for TPUs (TorchTPU), GPUs and CPUs.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors on stderr")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    prof = commands.add_parser(
        "profile",
        help="measure step time, FLOPs, MFU, memory, compilations and top operators",
        description="Profile one step of a model file on the present device.",
    )
    _add_run_args(prof)
    prof.add_argument("--precision", choices=MATMUL_PRECISIONS,
                      help="torch.set_float32_matmul_precision (default: the device's own: highest on CPU and "
                           "GPU, medium on TPU, TorchTPU's one-pass default)")
    prof.add_argument("--autocast", choices=AUTOCAST_DTYPES, help="run under torch.autocast with this dtype")
    prof.add_argument("--compile", metavar="BACKEND", help="torch.compile backend (inductor, aot_eager, tpu, ...)")
    prof.add_argument("--compile-mode", help="torch.compile mode (inductor only), e.g. max-autotune")
    prof.add_argument("--eager-mode", choices=("strict", "debug", "defer_and_fuse"), default="strict",
                      help="TorchTPU eager mode (TPU only)")
    prof.add_argument("--attention", choices=("full", "causal"), default="full",
                      help="attention FLOPs convention for MFU: full (PaLM/torchtitan, default) or causal (MaxText)")
    prof.add_argument("--agent", default="profiler", help="profiler agent definition: a name or a TOML path")
    prof.set_defaults(handler=_profile_command)

    tune = commands.add_parser(
        "tune",
        help="search eager/compile mode and precision with Optuna; verify the win; write a tuned config",
        description="Tune a model file (also: tpu-tune MODEL.py).",
    )
    _add_run_args(tune)
    tune.add_argument("--trials", type=int,
                      help="settings to measure, baseline and seeds included; repeats and rejections are free (default: "
                           "20%% of the settings the agents would measure, 12 to 48; a grid: all of them)")
    tune.add_argument("--timeout", type=float, help="stop starting trials after this many seconds")
    tune.add_argument("--sampler", choices=("tpe", "random", "grid"), default="tpe", help="Optuna sampler (default tpe)")
    tune.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    tune.add_argument("--space", default="default", help="search space: a name in search_spaces/ or a TOML path")
    tune.add_argument("--steps", type=int, default=5000,
                      help="steps of the run you plan; compile time is spread over them (default 5000)")
    tune.add_argument("--tolerance", type=float, default=1e-2,
                      help="largest relative error against fp32 eager a config may have (default 0.01)")
    tune.add_argument("--trial-timeout", type=float, default=300.0, help="seconds before a trial is killed (default 300)")
    tune.add_argument("--trial-memory-gb", type=float, help="address-space limit of the trial worker, GiB; also the study's "
                      "memory constraint (a trial whose measured peak memory exceeds it is infeasible)")
    tune.add_argument("--verify-rounds", type=int, default=12, help="interleaved rounds of the final comparison (default 12)")
    tune.add_argument("--storage", help="Optuna storage URL, e.g. postgresql://user@host/db (default: $TPU_TUNE_STORAGE, "
                      "else SQLite: the run folder's study.db, or with --study the results folder's studies.db); a "
                      "password may also come from PGPASSWORD or ~/.pgpass")
    tune.add_argument("--study", metavar="NAME", help="join the study NAME in the storage (created by its first worker): "
                      "every worker given the same storage and name works on one search")
    tune.add_argument("--heartbeat-interval", type=int, default=HEARTBEAT_INTERVAL_S, metavar="S",
                      help="seconds between a running trial's heartbeats (default 10)")
    tune.add_argument("--grace-period", type=int, metavar="S",
                      help="seconds without a heartbeat before a trial's worker counts as lost and its setting is "
                           "queued again (default: three heartbeats)")
    tune.add_argument("--cold", action="store_true",
                      help="no warm start: do not enqueue the best settings of earlier studies first")
    tune.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue the study of an earlier run folder")
    tune.add_argument("--lengths", type=Path, help="input length sample (CSV or one number a line; default: the file's "
                      "sample_lengths()); each trial's objective then includes its best shape buckets")
    tune.add_argument("--nproc", type=int, default=1, metavar="N",
                      help="run every trial on N ranks of this host, one process per device, and search how they "
                           "share a training step (data / fsdp / tensor layouts; default 1)")
    tune.add_argument("--plan", type=Path, metavar="PLAN_DIR",
                      help="with --nproc: seed the layouts a `tpu-tune plan` folder ranked first (mapped onto N ranks)")
    tune.add_argument("--max-buckets", type=int, default=8, help="most compiled shapes when inputs vary (default 8)")
    tune.add_argument("--bucket-align", type=int, default=8, help="bucket bounds are multiples of this (default 8)")
    tune.set_defaults(handler=_tune_command)

    plan_cmd = commands.add_parser(
        "plan",
        help="rank sharding layouts for a TPU slice with the TPU compiler, without owning one",
        description="Compile the model's training step ahead of time for a TPU topology, per layout.",
    )
    plan_cmd.add_argument("model_file", type=Path, help="a training workload (native contract, with loss())")
    plan_cmd.add_argument("--topology", required=True, help="v5p-256, v6e-64, v5e-16, tpu7x-128, or v5p:8x8x8")
    plan_cmd.add_argument("--global-batch", type=int, help="sequences per step (default: BATCH_SIZE per device)")
    plan_cmd.add_argument("--seq", type=int, help="sequence length (default: the file's SEQ_LEN)")
    plan_cmd.add_argument("--preset", help="a named model size from the file's PRESETS, e.g. 70b")
    plan_cmd.add_argument("--remat", default="full", metavar="POLICY",
                          help="per-block rematerialisation, by MaxText's names: full (default), minimal, "
                               "save_dot_except_mlpwi, save_qkv_proj, qkv_proj_offloaded, minimal_offloaded, ..., none, "
                               "or custom:decoder_layer_input=offload,query_proj=device,... (docs/planner.md)")
    plan_cmd.add_argument("--accumulation", type=int, default=1, metavar="N",
                          help="micro-batches a step (gradient accumulation; default 1)")
    plan_cmd.add_argument("--attention", choices=("full", "causal"), default="full", help="attention FLOPs convention for MFU")
    plan_cmd.add_argument("--max-layouts", type=int, default=10, help="layouts to compile (default 10)")
    plan_cmd.add_argument("--layout", action="append", metavar="DATAxFSDPxTENSOR[xCONTEXT]",
                          help="compile only this layout, e.g. 1x64x4 or 1x32x4x2 (repeatable)")
    search = plan_cmd.add_argument_group("search (Optuna over layout x remat x micro-batches)")
    search.add_argument("--budget", type=int, metavar="N",
                        help="search the joint space with N compiles instead of enumerating layouts")
    search.add_argument("--sampler", choices=("tpe", "random", "exhaustive"), default="tpe",
                        help="tpe (default), random, or exhaustive (every valid point; --budget optional)")
    search.add_argument("--seed", type=int, default=0, help="the sampler's seed (default 0)")
    search.add_argument("--remats", metavar="P1,P2,...", help="the remat policies to search (default: ten, docs/planner.md)")
    search.add_argument("--accumulations", metavar="N1,N2,...", help="micro-batch counts to search (default 1,2,4,8)")
    search.add_argument("--contexts", metavar="N1,N2,...", help="context-parallel sizes to search (default 1,2,4)")
    search.add_argument("--study", help="the study's name (default: one derived from the plan's inputs, so the same "
                                        "plan run again resumes)")
    search.add_argument("--storage", help="Optuna storage URL (default: $TPU_TUNE_STORAGE, else results/plans.db)")
    plan_cmd.add_argument("--workers", type=int, help="compiler processes at once (default: one per core, at most 4)")
    plan_cmd.add_argument("--mu-dtype", choices=("float32", "bfloat16"), default="float32",
                          help="AdamW's first moment's storage (MaxText's mu_dtype; default float32)")
    plan_cmd.add_argument("--fast", action="store_true",
                          help="screen layouts with the compiler's least optimisation effort: 2-4x quicker, same FLOPs and "
                               "collectives, but temporaries (so 'fits') overstated; see docs/planner.md")
    plan_cmd.add_argument("--out", type=Path, default=Path("results"), help="results folder (default: results/)")
    plan_cmd.set_defaults(handler=_plan_command)

    buckets_cmd = commands.add_parser(
        "buckets",
        help="choose shape buckets for inputs of varying length (few compiles, little padding)",
        description="Measure compile and step costs on this device, then choose the bucket bounds that "
                    "minimise a planned run's total time; compare with the usual strategies.",
    )
    buckets_cmd.add_argument("model_file", type=Path, help="a workload whose make_batch(batch, seq_len) takes any length")
    buckets_cmd.add_argument("--lengths", type=Path, help="length sample: CSV (a 'length' column) or one number a line "
                             "(default: the file's sample_lengths())")
    buckets_cmd.add_argument("--steps", type=int, default=20_000, help="steps of the planned run (default 20000)")
    buckets_cmd.add_argument("--max-buckets", type=int, default=8, help="most compiled shapes allowed (default 8)")
    buckets_cmd.add_argument("--align", type=int, default=8, help="bounds are multiples of this (default 8; 128 on TPU matmul units)")
    buckets_cmd.add_argument("--device", help="cpu, cuda, tpu (default: the best present)")
    buckets_cmd.add_argument("--compile-backend", help="torch.compile backend to measure (default: the device's: inductor / tpu)")
    buckets_cmd.add_argument("--batch-size", type=int, help="sequences per step (default: the file's BATCH_SIZE)")
    buckets_cmd.add_argument("--replay", type=int, default=0, metavar="N",
                             help="also replay N drawn steps through the workload per strategy and report measured totals")
    buckets_cmd.add_argument("--out", type=Path, default=Path("results"), help="results folder (default: results/)")
    buckets_cmd.set_defaults(handler=_buckets_command)

    dash = commands.add_parser(
        "dashboard",
        help="one HTML page of every run, MFU, plan and bucketing result in a results folder",
        description="Write RESULTS_DIR/dashboard.html (self-contained, works offline), or serve it with --serve.",
    )
    dash.add_argument("results_dir", type=Path, help="the results folder that holds the run folders")
    dash.add_argument("--out", type=Path, help="where to write the page (default: RESULTS_DIR/dashboard.html)")
    dash.add_argument("--csv", type=Path, help="also write the runs table as CSV here")
    dash.add_argument("--serve", action="store_true",
                      help="serve the page (re-rendered when runs change) and the folder's files until Ctrl-C")
    dash.add_argument("--host", default="127.0.0.1", help="address to bind with --serve (default 127.0.0.1)")
    dash.add_argument("--port", type=int, default=8765, help="port with --serve (default 8765; 0: any free port)")
    dash.add_argument("--details", type=int, default=6,
                      help="tuning runs (newest first) with per-trial figures on the page (default 6)")
    dash.set_defaults(handler=_dashboard_command)

    study_cmd = commands.add_parser(
        "study", help="a study shared by several workers (--study): its status, or finish it",
        description="See how far a shared study is, or verify its best once on this host and write the tuned config.")
    actions = study_cmd.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, text in (("status", "trials done / running / failed, per worker, and the best so far"),
                         ("finish", "verify the best against the baseline on this host, once; write the run folder")):
        sub = actions.add_parser(action, help=text, description=text)
        sub.add_argument("--storage", help="the study's storage URL (default: $TPU_TUNE_STORAGE, else "
                                           "OUT/studies.db)")
        sub.add_argument("--study", required=True, metavar="NAME", help="the study's name")
        sub.add_argument("--out", type=Path, default=Path("results"), help="results folder (default: results/)")
        if action == "finish":
            sub.add_argument("--model", type=Path, metavar="FILE",
                             help="the model file, where it lies elsewhere on this host than the study recorded")
            sub.add_argument("--device", default="auto", help="auto (default), tpu, cuda or cpu")
            sub.add_argument("--now", action="store_true",
                             help="verify even while trials are still running (the best measured so far)")
        sub.set_defaults(handler=_study_command)

    devices_cmd = commands.add_parser(
        "devices", help="each backend: available here or why not; installed versions; the TorchTPU API check",
        description="List the tpu, cuda and cpu backends (available here, or why not), the installed torch, "
                    "torch-tpu, libtpu, jax, jaxlib and torchax, and check every TorchTPU name tpu-tune uses "
                    "against the installed torch-tpu (exit status 1 when one is missing).")
    devices_cmd.add_argument("--json", action="store_true", help="print the report as JSON")
    devices_cmd.set_defaults(handler=_devices_command)

    apply_cmd = commands.add_parser("apply", help="print the Python that applies a tuned config (runs as printed)")
    apply_cmd.add_argument("config", type=Path, help="a tuned_config.toml")
    apply_cmd.set_defaults(handler=_apply_command)
    return parser


def _tune_command(args: argparse.Namespace) -> int:
    from tpu_tuner.core.credentials import redact, without_password
    from tpu_tuner.studies.storage import storage_from_environment
    from tpu_tuner.tuning.options import TuneOptions

    options = TuneOptions(
        trials=args.trials, timeout_s=args.timeout, sampler=args.sampler, seed=args.seed, space=args.space,
        planned_steps=args.steps, tolerance=args.tolerance, trial_timeout_s=args.trial_timeout,
        memory_limit_bytes=int(args.trial_memory_gb * 1024**3) if args.trial_memory_gb else None,
        verify_rounds=args.verify_rounds, device=None if args.device == "auto" else args.device,
        batch_size=args.batch_size, seq_len=args.seq_len, storage=args.storage, out=args.out, resume=args.resume,
        lengths_file=args.lengths, max_buckets=args.max_buckets, bucket_align=args.bucket_align,
        nproc=args.nproc, plan=args.plan, study=args.study, heartbeat_interval_s=args.heartbeat_interval,
        grace_period_s=args.grace_period, warm_start=not args.cold,
        trial_settings=None,  # the default, built by tune(): building it here would import torch
    )
    # Bad options, space or storage are refused here, in well under a second: before torch and
    # optuna are imported, before any model runs and before a run folder exists.
    options.preflight()
    from tpu_tuner.core.units import ms
    from tpu_tuner.api import tune
    from tpu_tuner.tuning.study import Progress

    def show(event: Progress) -> None:
        # "best" is the same quantity a finished trial's line leads with (its objective).
        best = f"best {ms(event.best_seconds)} {event.objective}" if event.best_seconds else "best -"
        # The search's best belongs on trial lines only; other phases show where and when.
        where = f"trial {event.trial}/{event.trials} | {best}" if event.trial else event.phase
        print(f"[{where} | {event.elapsed:5.0f} s] {event.message}", flush=True)

    result = tune(args.model_file, options, progress=show)
    base, chosen, v = result.baseline, result.chosen, result.verification
    print()
    if not result.verified:
        print(f"search    done: {v.message}")
        print(f"results   {result.run_dir}/ (report.md, trials.csv: this worker's view of the study)")
        storage = "" if options.storage is None or options.storage == storage_from_environment() else \
            f" --storage {without_password(options.storage)}"
        print(f"status    tpu-tune study status{storage} --study {result.study.study_name}"
              + (f" --out {options.out}" if options.storage is None else ""))
        return 0
    if base is not None and chosen is not None:
        planned = options.planned_steps
        print(f"baseline  steady step {ms(base.step_median)}, amortised {ms(base.amortised_step(planned))}, "
              f"MFU {base.mfu:.1%}  ({Candidate.from_dict(base.candidate).describe()})")
        print(f"tuned     steady step {ms(chosen.step_median)}, amortised {ms(chosen.amortised_step(planned))}, "
              f"MFU {chosen.mfu:.1%}  ({v.chosen.describe()})")
        print(f"          (amortised = steady step + compile time / {planned} planned steps, from the search)")
        print(f"accuracy  relative error {chosen.accuracy_error:.2e} (tolerance {options.tolerance:g})")
    print(f"speedup   {v.message}")
    if v.speedup is not None:
        print("          (steady step against steady step, re-measured interleaved; compile time is not in it)")
    print(f"results   {result.run_dir}/ (tuned_config.toml, report.md, trials.csv, plots)")
    print(f"dashboard optuna-dashboard {redact(str(result.best_config.provenance['study']['storage']))}")
    return 0


def _study_command(args: argparse.Namespace) -> int:
    from tpu_tuner.core.credentials import redact
    from tpu_tuner.studies.storage import check_storage, shared_sqlite, storage_from_environment

    storage = args.storage or storage_from_environment() or shared_sqlite(args.out)
    check_storage(storage)
    if args.action == "status":
        from tpu_tuner.tuning.study_admin import study_status

        print("\n".join(study_status(storage, args.study).lines()))
        return 0
    from tpu_tuner.api import finish_study

    result = finish_study(storage, args.study, args.out, args.model, None if args.device == "auto" else args.device,
                          now=args.now)
    print(f"speedup   {result.verification.message} (verified on {result.verification.host})")
    print(f"tuned     {result.verification.chosen.describe()}")
    print(f"results   {result.run_dir}/ (tuned_config.toml, report.md, trials.csv, plots)")
    print(f"dashboard optuna-dashboard {redact(storage)}")
    return 0


def _buckets_command(args: argparse.Namespace) -> int:
    from tpu_tuner.bucketing.study import BucketOptions, plan_buckets
    from tpu_tuner.outputs.bucket_report import render_terminal
    from tpu_tuner.core.run_folder import new_run_dir
    from tpu_tuner.outputs.write import write_buckets

    options = BucketOptions(lengths_file=args.lengths, steps=args.steps, max_buckets=args.max_buckets, align=args.align,
                            device=args.device, compile_backend=args.compile_backend, batch_size=args.batch_size,
                            replay_steps=args.replay)
    result = plan_buckets(args.model_file, options, progress=lambda message: print(message, flush=True))
    run_dir = new_run_dir(args.out, result.workload, "buckets")
    written = write_buckets(run_dir, result, args.model_file)
    print()
    print(render_terminal(result))
    print(f"\nwrote {run_dir}/ ({', '.join(written)})")
    return 0


def _plan_command(args: argparse.Namespace) -> int:
    from dataclasses import replace
    from tpu_tuner.core.errors import UserInputError
    from tpu_tuner.model.layouts import parse_layout
    from tpu_tuner.planner.plan import PlanOptions
    from tpu_tuner.outputs.plan_report import render_terminal
    from tpu_tuner.core.run_folder import COMPILER_LOG, PLAN_JSON, PLAN_MD, PLAN_PNG, SHARDING_CONFIG
    from tpu_tuner.outputs.write import plan_to_folder

    from tpu_tuner.planner.remat import parse_remat

    layouts = None
    if args.layout:
        try:
            layouts = [parse_layout(text) for text in args.layout]
        except ValueError as exc:
            raise UserInputError(f"--layout takes DATAxFSDPxTENSOR[xCONTEXT], e.g. 1x64x4: {exc}") from exc
    parse_remat(args.remat, "--remat")
    if args.accumulation < 1:
        raise UserInputError(f"--accumulation must be at least 1, not {args.accumulation}")
    if args.budget is not None and args.budget < 1:
        raise UserInputError(f"--budget must be at least 1, not {args.budget}")
    if args.seed < 0:
        raise UserInputError(f"--seed must be 0 or more, not {args.seed}")
    searching = args.budget is not None or args.sampler == "exhaustive"
    search_only = [f"--{flag.replace('_', '-')}" for flag in ("remats", "accumulations", "contexts", "study", "storage")
                   if getattr(args, flag) is not None]
    if not searching and search_only:
        raise UserInputError(f"{', '.join(search_only)} set(s) the search's space or study: give --budget N "
                             "(or --sampler exhaustive)")
    if searching and args.layout:
        raise UserInputError("--layout names the layouts to compile instead of a search: leave out --budget, or "
                             "give the search's axes (--contexts, --remats, --accumulations)")
    options = PlanOptions(topology=args.topology, global_batch=args.global_batch, seq_len=args.seq, preset=args.preset,
                          remat=args.remat, accumulation=args.accumulation, attention=args.attention,
                          first_moment_dtype=args.mu_dtype,
                          max_layouts=args.max_layouts, layouts=layouts, fast_compile=args.fast,
                          budget=args.budget, sampler=args.sampler, seed=args.seed, study=args.study, storage=args.storage)
    if args.remats:
        options = replace(options, remats=tuple(parse_remat(r, "--remats").name for r in args.remats.split(",") if r.strip()))
    for flag in ("accumulations", "contexts"):
        text = getattr(args, flag)
        if text:
            try:
                values = tuple(int(x) for x in text.split(","))
            except ValueError as exc:
                raise UserInputError(f"--{flag} takes whole numbers separated by commas, not {text!r}") from exc
            if min(values) < 1:
                raise UserInputError(f"--{flag} takes sizes of at least 1, not {text!r}")
            options = replace(options, **{flag: values})
    if args.workers is not None:
        if args.workers < 1:
            raise UserInputError(f"--workers must be at least 1, not {args.workers}")
        options = replace(options, workers=args.workers)
    run_dir, result = plan_to_folder(args.model_file, options, args.out,
                                     progress=lambda message: print(message, flush=True))
    print()
    print(render_terminal(result, str(args.model_file), str(run_dir)))
    print(f"\nwrote {run_dir}/ ({PLAN_JSON}, {PLAN_MD}, {PLAN_PNG}" + (f", {SHARDING_CONFIG}" if result.best else "")
          + f", {COMPILER_LOG}: the compiler processes' own output)")
    return 0


def _devices_command(args: argparse.Namespace) -> int:
    import json

    from tpu_tuner.devices.listing import devices_report

    report = devices_report()
    print(json.dumps(report.to_dict(), indent=2) if args.json else "\n".join(report.lines()))
    # A torch-tpu that lacks a name the adapter uses is an error (CI runs this); none installed is not.
    return 1 if report.torchtpu_api_ok is False else 0


def _dashboard_command(args: argparse.Namespace) -> int:
    from tpu_tuner.dashboard import collect, make_server, write_csv, write_dashboard
    from tpu_tuner.core.errors import UserInputError

    if args.details < 0:
        raise UserInputError(f"--details must be 0 or more, not {args.details}")
    if not args.serve or args.csv is not None:
        collection = collect(args.results_dir)
        if args.csv is not None:
            print(f"wrote {write_csv(collection, args.csv)}")
        if not args.serve:
            print(write_dashboard(args.results_dir, args.out, details=args.details, collection=collection))
            return 0
    server = make_server(args.results_dir, args.host, args.port, details=args.details)
    # A process started in the background by a non-interactive shell (`cmd &`, nohup, CI) inherits
    # SIGINT ignored, and Python then never raises KeyboardInterrupt: Ctrl-C / SIGINT must stop it
    # all the same (a test run launched that way hung here for 30 s).
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(f"serving {args.results_dir} on {server.url} (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        print("\nstopped")
    finally:
        server.server_close()
    return 0


def _apply_command(args: argparse.Namespace) -> int:
    from tpu_tuner.knobs.tuned_config import TunedConfig

    config = TunedConfig.load(args.config)
    print(f"# {args.config}: Python that applies it")
    print("\n".join(config.instructions(args.config)))
    return 0


def _likely_device_kind(device: str) -> str:
    """The device kind `--device` names, or for auto "tpu" where this host has a TPU chip and
    torch-tpu (the backend the worker will pick), else "other" (read without importing torch)."""
    if device != "auto":
        return device
    from tpu_tuner.core.tpu_host import torch_tpu_installed, tpu_chips_on_host

    return "tpu" if tpu_chips_on_host() and torch_tpu_installed() else "other"


def _profile_command(args: argparse.Namespace) -> int:
    # Imported here so that `tpu-tune --help` stays fast.
    from tpu_tuner.knobs.matmul_precision import device_default
    from tpu_tuner.runner.isolated_profile import profile_in_worker
    from tpu_tuner.profiling.settings import ProfilerSettings
    from tpu_tuner.outputs.profile_report import render_terminal
    from tpu_tuner.core.run_folder import PROFILE_JSON, PROFILE_MD
    from tpu_tuner.outputs.write import save_profile

    candidate = Candidate.from_fields(  # the profile command's flags name the pre-registry fields
        eager_mode=args.eager_mode,
        compile_backend=args.compile,
        compile_mode=args.compile_mode,
        matmul_precision=args.precision or device_default(_likely_device_kind(args.device)),
        autocast_dtype=args.autocast,
    )
    # The model file runs in a worker, never in this process (docs/run-safety.md).
    result = profile_in_worker(args.model_file, candidate, None if args.device == "auto" else args.device,
                               args.batch_size, args.seq_len, args.attention, ProfilerSettings.load(args.agent))
    run_dir = save_profile(result, args.out)
    print(render_terminal(result))
    print(f"\nwrote {run_dir / PROFILE_JSON} and {run_dir / PROFILE_MD}")
    return 0


COMMANDS = ("profile", "tune", "plan", "buckets", "dashboard", "apply", "study", "devices")


def _default_to_tune(argv: list[str]) -> list[str]:
    """`tpu-tune model.py ...` means `tpu-tune tune model.py ...`."""
    for index, arg in enumerate(argv):
        if not arg.startswith("-"):
            if arg not in COMMANDS:
                return argv[:index] + ["tune"] + argv[index:]
            break
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tpu-tune` console script."""
    parser = build_parser()
    args = parser.parse_args(_default_to_tune(list(sys.argv[1:] if argv is None else argv)))
    level = logging.DEBUG if args.debug else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if not args.debug:  # torch's own INFO lines (inductor's registrations on import) are not ours to print
        logging.getLogger("torch").setLevel(max(level, logging.WARNING))
    from tpu_tuner.core.credentials import RedactingFilter, redact

    for handler in logging.getLogger().handlers:  # no log line shows a password (docs/run-safety.md)
        handler.addFilter(RedactingFilter())
    try:
        return args.handler(args)
    except TpuTuneError as exc:
        if args.debug:
            raise
        print(f"tpu-tune: error: {redact(str(exc))}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        print("tpu-tune: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
