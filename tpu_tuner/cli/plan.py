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

    parser.add_argument(
        "model_file",
        type=_model_source,
        help="a training workload (native contract, with loss()), a decoder shape (shape.toml or "
        "decoder:d_model=...), or a Hugging Face config: hf:./folder, hf:org/name, "
        'hf:llama?hidden_size=512,... (docs/planner.md, "Planning a Hugging Face model")',
    )
    parser.add_argument(
        "--topology",
        required=True,
        help="v5p-256, v6e-64, v5e-16, tpu7x-128, or v5p:8x8x8; several separated by commas "
        "(v5e-256,v5p-128,v6e-256) plans each and ranks them by tokens/s per chip and per dollar",
    )
    parser.add_argument(
        "--price",
        action="append",
        metavar="GEN=USD_PER_CHIP_HOUR",
        help="a generation's on-demand price per chip-hour for the ranking of several topologies, "
        "e.g. v6e=2.70 (repeatable or comma-separated; overrides tpu_tuner/planner/tpu_prices.toml)",
    )
    parser.add_argument(
        "--slices",
        type=int,
        default=default("slices"),
        metavar="N",
        help="N such slices joined by the data-center network (multi-slice; default %(default)s): "
        "layouts then say which axes cross slices, e.g. 2x64x1,dcn_data=2",
    )
    parser.add_argument(
        "--global-batch",
        type=int,
        help="sequences per step (default: BATCH_SIZE per device; an hf: config: one per device)",
    )
    parser.add_argument(
        "--seq",
        type=int,
        help="sequence length (default: the file's SEQ_LEN; an hf: config's max_position_embeddings, at most 8192)",
    )
    parser.add_argument("--preset", help="a named model size from the file's PRESETS, e.g. 70b")
    parser.add_argument(
        "--remat",
        default=default("remat"),
        metavar="POLICY",
        help="per-block rematerialisation, by MaxText's names: full, minimal, save_dot_except_mlpwi, "
        "save_qkv_proj, qkv_proj_offloaded, minimal_offloaded, ..., none, or "
        "custom:decoder_layer_input=offload,query_proj=device,... (default %(default)s; "
        "docs/planner.md)",
    )
    parser.add_argument(
        "--accumulation",
        type=int,
        default=default("accumulation"),
        metavar="N",
        help="micro-batches a step (gradient accumulation; default %(default)s)",
    )
    parser.add_argument(
        "--attention",
        choices=("full", "causal"),
        default=default("attention"),
        help="attention FLOPs convention for MFU (default %(default)s)",
    )
    parser.add_argument(
        "--max-layouts", type=int, default=default("max_layouts"), help="layouts to compile (default %(default)s)"
    )
    parser.add_argument(
        "--layout",
        action="append",
        metavar="DATAxFSDPxTENSOR[xCONTEXT][,AXIS=N...]",
        help="compile only this layout, e.g. 1x64x4, 1x32x4x2, 1x32x1,expert=4 or 2x64x1,dcn_data=2; "
        "AXIS: fsdp_transpose, expert, dcn_data, dcn_fsdp (repeatable)",
    )
    search = parser.add_argument_group("search (Optuna over layout x remat x micro-batches)")
    search.add_argument(
        "--budget", type=int, metavar="N", help="search the joint space with N compiles instead of enumerating layouts"
    )
    search.add_argument(
        "--sampler",
        choices=("tpe", "random", "exhaustive"),
        default=default("sampler"),
        help="tpe, random, or exhaustive (every valid point; --budget optional); default %(default)s",
    )
    search.add_argument("--seed", type=int, default=default("seed"), help="the sampler's seed (default %(default)s)")
    search.add_argument(
        "--remats",
        metavar="P1,P2,...",
        help=f"the remat policies to search (default: the {len(default('remats'))} of docs/planner.md)",
    )
    search.add_argument(
        "--accumulations",
        metavar="N1,N2,...",
        help=f"micro-batch counts to search (default {_joined(default('accumulations'))})",
    )
    search.add_argument(
        "--contexts",
        metavar="N1,N2,...",
        help=f"context-parallel sizes to search (default {_joined(default('contexts'))})",
    )
    search.add_argument(
        "--study",
        help="the study's name (default: one derived from the plan's inputs, so the same plan run again resumes)",
    )
    search.add_argument("--storage", help="Optuna storage URL (default: $TPU_TUNE_STORAGE, else results/plans.db)")
    parser.add_argument("--workers", type=int, help="compiler processes at once (default: one per core, at most 4)")
    parser.add_argument(
        "--optimizer",
        default=default("optimizer"),
        metavar="adamw|sgd",
        help="the step's optimizer, as MaxText's opt_type: adamw (two moments a parameter) or sgd "
        "(optax.sgd without momentum: no state); default %(default)s",
    )
    parser.add_argument(
        "--mu-dtype",
        choices=("float32", "bfloat16"),
        help="AdamW's first moment's storage (MaxText's mu_dtype; default: the weights' dtype, as "
        "MaxText's mu_dtype follows weight_dtype when unset)",
    )
    parser.add_argument(
        "--weight-dtype",
        default=default("weight_dtype"),
        metavar="float32|bfloat16",
        help="the master weights' storage, and so the gradients' and AdamW's second moment's "
        "(MaxText's weight_dtype; default %(default)s)",
    )
    parser.add_argument(
        "--quantization",
        metavar="int8|fp8",
        help="run the decoder blocks' matmuls, forward and backward, in 8 bits: int8 (MaxText's "
        "AQT int8; v5e, v6e) or fp8 (MaxText's fp8_full; TPU7x); default: bf16. MFU stays "
        'against the bf16 peak (docs/planner.md, "Precision of the step")',
    )
    parser.add_argument(
        "--vocab-tiling",
        type=int,
        default=default("vocab_tiling"),
        metavar="N",
        help="compute the loss's logits N slices of the sequence at a time (MaxText's num_vocab_tiling; "
        "the generic decoder's shapes; default %(default)s)",
    )
    parser.add_argument(
        "--fast",
        action="store_true",
        help="screen layouts with the compiler's least optimisation effort: 2-4x quicker, same FLOPs "
        "and collectives, but temporaries (so 'fits') overstated; see docs/planner.md",
    )
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


def _check_precision(args: argparse.Namespace) -> None:
    """--optimizer, --weight-dtype and --quantization: known values, and an 8-bit peak Google states
    for the topology's generation (predict.QUANTIZED_PEAK_TFLOPS), before any compiler starts."""
    from tpu_tuner.core.errors import UserInputError
    from tpu_tuner.planner.optimizer import check_optimizer
    from tpu_tuner.planner.predict import quantized_peak_refusal
    from tpu_tuner.planner.quantized_matmul import QUANTIZATIONS
    from tpu_tuner.planner.topology import parse_topology

    check_optimizer(args.optimizer)
    if args.optimizer == "sgd" and args.mu_dtype:
        raise UserInputError("--mu-dtype is AdamW's first moment's storage: --optimizer sgd keeps no moments")
    if args.weight_dtype not in ("float32", "bfloat16"):
        raise UserInputError(f"--weight-dtype takes float32 or bfloat16, not {args.weight_dtype!r}")
    if args.quantization is None:
        return
    if args.quantization not in QUANTIZATIONS:
        raise UserInputError(f"--quantization takes {' or '.join(QUANTIZATIONS)}, not {args.quantization!r}")
    refusal = quantized_peak_refusal(parse_topology(args.topology).chip.generation, args.quantization)
    if refusal:
        raise UserInputError(f"--quantization {args.quantization} on {args.topology}: {refusal}")


def run(args: argparse.Namespace) -> int:
    """Check the flags, plan into a run folder, print the ranking."""
    from tpu_tuner.core.errors import UserInputError
    from tpu_tuner.core.run_folder import COMPILER_LOG, PLAN_JSON, PLAN_MD, PLAN_PNG, SHARDING_CONFIG
    from tpu_tuner.model.layouts import parse_layout
    from tpu_tuner.outputs.plan_report import render_terminal
    from tpu_tuner.outputs.write import plan_to_folder
    from tpu_tuner.planner.plan import PlanOptions
    from tpu_tuner.planner.remat import parse_remat

    topologies, prices = _ranking_flags(args)  # a list of topologies ranks them (docs/planner.md, "Which TPU to rent")
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
                raise UserInputError(
                    f"--layout {layout.short()} spans {layout.slices} slice(s) (dcn_data x dcn_fsdp), "
                    f"--slices is {args.slices}: the DCN ways' product must be the slice count"
                )
    parse_remat(args.remat, "--remat")
    if args.accumulation < 1:
        raise UserInputError(f"--accumulation must be at least 1, not {args.accumulation}")
    if args.budget is not None and args.budget < 1:
        raise UserInputError(f"--budget must be at least 1, not {args.budget}")
    if args.seed < 0:
        raise UserInputError(f"--seed must be 0 or more, not {args.seed}")
    _check_precision(args)
    searching = args.budget is not None or args.sampler == "exhaustive"
    search_only = [
        f"--{flag.replace('_', '-')}"
        for flag in ("remats", "accumulations", "contexts", "study", "storage")
        if getattr(args, flag) is not None
    ]
    if not searching and search_only:
        raise UserInputError(
            f"{', '.join(search_only)} set(s) the search's space or study: give --budget N (or --sampler exhaustive)"
        )
    if searching and args.layout:
        raise UserInputError(
            "--layout names the layouts to compile instead of a search: leave out --budget, or "
            "give the search's axes (--contexts, --remats, --accumulations)"
        )
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
    options = PlanOptions(
        topology=args.topology,
        slices=args.slices,
        global_batch=args.global_batch,
        seq_len=args.seq,
        preset=args.preset,
        remat=args.remat,
        accumulation=args.accumulation,
        attention=args.attention,
        first_moment_dtype=args.mu_dtype or args.weight_dtype,
        weight_dtype=args.weight_dtype,
        optimizer=args.optimizer,
        quantization=args.quantization,
        vocab_tiling=args.vocab_tiling,
        max_layouts=args.max_layouts,
        layouts=layouts,
        fast_compile=args.fast,
        budget=args.budget,
        sampler=args.sampler,
        seed=args.seed,
        study=args.study,
        storage=args.storage,
        **given,
    )
    if len(topologies) > 1:
        return _rank(args, options, topologies, prices)
    run_dir, result = plan_to_folder(
        args.model_file, options, args.out, progress=lambda message: print(message, flush=True)
    )
    print()
    print(render_terminal(result, str(args.model_file), str(run_dir)))
    print(
        f"\nwrote {run_dir}/ ({PLAN_JSON}, {PLAN_MD}, {PLAN_PNG}"
        + (f", {SHARDING_CONFIG}" if result.best else "")
        + f", {COMPILER_LOG}: the compiler processes' own output)"
    )
    return 0


def _ranking_flags(args: argparse.Namespace) -> tuple[list[str], dict[str, Any]]:
    """--topology as a list (one entry: today's single plan, the text as given) and the prices a
    ranking uses; a bad entry, a bad --price, or a flag a ranking cannot take is refused in one
    line before anything compiles."""
    from tpu_tuner.core.errors import UserInputError
    from tpu_tuner.planner.prices import parse_price_flags, price_table
    from tpu_tuner.planner.topology import parse_topology

    given = parse_price_flags(args.price)
    if "," not in args.topology:
        if given:
            raise UserInputError(
                "--price prices the ranking of several topologies: give --topology A,B,... (e.g. v5e-256,v6e-256)"
            )
        return [args.topology], {}
    entries = [entry.strip() for entry in args.topology.split(",")]
    seen: dict[str, str] = {}
    for number, entry in enumerate(entries, 1):
        if not entry:
            raise UserInputError(f"--topology {args.topology!r}: entry {number} is empty")
        shape = parse_topology(entry).jax_name
        if shape in seen:
            raise UserInputError(f"--topology {args.topology!r}: {entry} is the same slice as {seen[shape]} ({shape})")
        seen[shape] = entry
    if args.layout:
        raise UserInputError(
            "--layout names layouts of one slice's devices: give one --topology, or leave out --layout"
        )
    return entries, price_table(given)


def _rank(args: argparse.Namespace, options: Any, topologies: list[str], prices: dict[str, Any]) -> int:
    """Plan every topology with the same options, then print the ranking."""
    from tpu_tuner.outputs.ranking_report import rank_to_folder, render_terminal

    folder, ranking = rank_to_folder(
        args.model_file, options, topologies, prices, args.out, progress=lambda message: print(message, flush=True)
    )
    print()
    print(render_terminal(ranking.to_dict(), str(folder)))
    return 0
