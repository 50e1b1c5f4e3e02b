"""`tpu-tune plan`: rank sharding layouts for a TPU slice with the TPU compiler (JAX compile-only).

Flags take their defaults from `PlanOptions` (planner/plan.py), read when this command's parser
is built: importing the planner is left to the runs that plan.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tpu_tuner.cli.common import add_out, default_of

NAME = "plan"
HELP = "rank sharding layouts for a TPU slice with the TPU compiler, without owning one"
DESCRIPTION = "Compile the model's training step ahead of time for a TPU topology, per layout."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The plan command's flags, their defaults read from `PlanOptions`."""
    from tpu_tuner.planner.plan import PlanOptions

    def default(name: str) -> Any:
        return default_of(PlanOptions, name)

    parser.add_argument("model_file", type=_model_source,
                        help="a training workload (native contract, with loss()), a decoder shape (shape.toml or "
                             "decoder:d_model=...), or a Hugging Face config: hf:./folder, hf:org/name, "
                             "hf:llama?hidden_size=512,... (docs/planner.md, \"Planning a Hugging Face model\")")
    parser.add_argument("--topology", required=True, help="v5p-256, v6e-64, v5e-16, tpu7x-128, or v5p:8x8x8")
    parser.add_argument("--slices", type=int, default=default("slices"), metavar="N",
                        help="N such slices joined by the data-center network (multi-slice; default %(default)s): "
                             "layouts then say which axes cross slices, e.g. 2x64x1,dcn_data=2")
    parser.add_argument("--global-batch", type=int,
                        help="sequences per step (default: BATCH_SIZE per device; an hf: config: one per device)")
    parser.add_argument("--seq", type=int, help="sequence length (default: the file's SEQ_LEN; an hf: config's "
                                                 "max_position_embeddings, at most 8192)")
    parser.add_argument("--preset", help="a named model size from the file's PRESETS, e.g. 70b")
    parser.add_argument("--remat", default=default("remat"), metavar="POLICY",
                        help="per-block rematerialisation, by MaxText's names: full, minimal, save_dot_except_mlpwi, "
                             "save_qkv_proj, qkv_proj_offloaded, minimal_offloaded, ..., none, or "
                             "custom:decoder_layer_input=offload,query_proj=device,... (default %(default)s; "
                             "docs/planner.md)")
    parser.add_argument("--accumulation", type=int, default=default("accumulation"), metavar="N",
                        help="micro-batches a step (gradient accumulation; default %(default)s)")
    parser.add_argument("--attention", choices=("full", "causal"), default=default("attention"),
                        help="attention FLOPs convention for MFU (default %(default)s)")
    parser.add_argument("--max-layouts", type=int, default=default("max_layouts"),
                        help="layouts to compile (default %(default)s)")
    parser.add_argument("--layout", action="append", metavar="DATAxFSDPxTENSOR[xCONTEXT][,AXIS=N...]",
                        help="compile only this layout, e.g. 1x64x4, 1x32x4x2, 1x32x1,expert=4 or 2x64x1,dcn_data=2; "
                             "AXIS: fsdp_transpose, expert, dcn_data, dcn_fsdp (repeatable)")
    search = parser.add_argument_group("search (Optuna over layout x remat x micro-batches)")
    search.add_argument("--budget", type=int, metavar="N",
                        help="search the joint space with N compiles instead of enumerating layouts")
    search.add_argument("--sampler", choices=("tpe", "random", "exhaustive"), default=default("sampler"),
                        help="tpe, random, or exhaustive (every valid point; --budget optional); default %(default)s")
    search.add_argument("--seed", type=int, default=default("seed"), help="the sampler's seed (default %(default)s)")
    search.add_argument("--remats", metavar="P1,P2,...",
                        help=f"the remat policies to search (default: the {len(default('remats'))} of docs/planner.md)")
    search.add_argument("--accumulations", metavar="N1,N2,...",
                        help=f"micro-batch counts to search (default {_joined(default('accumulations'))})")
    search.add_argument("--contexts", metavar="N1,N2,...",
                        help=f"context-parallel sizes to search (default {_joined(default('contexts'))})")
    search.add_argument("--study", help="the study's name (default: one derived from the plan's inputs, so the same "
                                        "plan run again resumes)")
    search.add_argument("--storage", help="Optuna storage URL (default: $TPU_TUNE_STORAGE, else results/plans.db)")
    parser.add_argument("--workers", type=int, help="compiler processes at once (default: one per core, at most 4)")
    parser.add_argument("--mu-dtype", choices=("float32", "bfloat16"), default=default("first_moment_dtype"),
                        help="AdamW's first moment's storage (MaxText's mu_dtype; default %(default)s)")
    parser.add_argument("--fast", action="store_true",
                        help="screen layouts with the compiler's least optimisation effort: 2-4x quicker, same FLOPs "
                             "and collectives, but temporaries (so 'fits') overstated; see docs/planner.md")
    add_out(parser)


def _model_source(text: str) -> str | Path:
    """The model argument: an ``hf:`` source stays the text as written (a Path would turn
    ``hf:./Llama-3.1-70B/`` into ``hf:Llama-3.1-70B``, no longer a folder's name); else a path."""
    return text if text.startswith("hf:") else Path(text)


def _joined(values: tuple[int, ...]) -> str:
    return ",".join(str(v) for v in values)


def _sizes(flag: str, text: str) -> tuple[int, ...]:
    """--accumulations / --contexts: whole numbers of at least 1, separated by commas."""
    from tpu_tuner.core.errors import UserInputError

    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError as exc:
        raise UserInputError(f"--{flag} takes whole numbers separated by commas, not {text!r}") from exc
    if min(values) < 1:
        raise UserInputError(f"--{flag} takes sizes of at least 1, not {text!r}")
    return values


def run(args: argparse.Namespace) -> int:
    """Check the flags, plan into a run folder, print the ranking."""
    from tpu_tuner.core.errors import UserInputError
    from tpu_tuner.core.run_folder import COMPILER_LOG, PLAN_JSON, PLAN_MD, PLAN_PNG, SHARDING_CONFIG
    from tpu_tuner.model.layouts import parse_layout
    from tpu_tuner.outputs.plan_report import render_terminal
    from tpu_tuner.outputs.write import plan_to_folder
    from tpu_tuner.planner.plan import PlanOptions
    from tpu_tuner.planner.remat import parse_remat

    layouts = None
    if args.slices < 1:
        raise UserInputError(f"--slices must be at least 1, not {args.slices}")
    if args.layout:
        try:
            layouts = [parse_layout(text) for text in args.layout]
        except ValueError as exc:
            raise UserInputError(f"--layout takes DATAxFSDPxTENSOR[xCONTEXT][,AXIS=N...], e.g. 1x64x4: {exc}") from exc
        for layout in layouts:
            if layout.slices != args.slices:
                raise UserInputError(f"--layout {layout.short()} spans {layout.slices} slice(s) (dcn_data x dcn_fsdp), "
                                     f"--slices is {args.slices}: the DCN ways' product must be the slice count")
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
    # Only what was given: a flag left out keeps PlanOptions' own default.
    given: dict[str, Any] = {}
    if args.remats:
        given["remats"] = tuple(parse_remat(r, "--remats").name for r in args.remats.split(",") if r.strip())
    for flag in ("accumulations", "contexts"):
        if getattr(args, flag):
            given[flag] = _sizes(flag, getattr(args, flag))
    if args.workers is not None:
        if args.workers < 1:
            raise UserInputError(f"--workers must be at least 1, not {args.workers}")
        given["workers"] = args.workers
    options = PlanOptions(topology=args.topology, slices=args.slices, global_batch=args.global_batch, seq_len=args.seq, preset=args.preset,
                          remat=args.remat, accumulation=args.accumulation, attention=args.attention,
                          first_moment_dtype=args.mu_dtype,
                          max_layouts=args.max_layouts, layouts=layouts, fast_compile=args.fast,
                          budget=args.budget, sampler=args.sampler, seed=args.seed, study=args.study,
                          storage=args.storage, **given)
    run_dir, result = plan_to_folder(args.model_file, options, args.out,
                                     progress=lambda message: print(message, flush=True))
    print()
    print(render_terminal(result, str(args.model_file), str(run_dir)))
    print(f"\nwrote {run_dir}/ ({PLAN_JSON}, {PLAN_MD}, {PLAN_PNG}" + (f", {SHARDING_CONFIG}" if result.best else "")
          + f", {COMPILER_LOG}: the compiler processes' own output)")
    return 0
