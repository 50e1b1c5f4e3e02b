"""`tpu-tune plan`: rank sharding layouts for a TPU slice with the TPU compiler (JAX compile-only).

Flags are generated from `PlanOptions`' sections (planner/options.py), which state their names,
help and defaults once; importing them, when this command's parser is built, imports the planner.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tpu_tuner.cli.common import add_out
from tpu_tuner.core.flags import add_section, sections_from

NAME = "plan"
HELP = "rank sharding layouts for a TPU slice with the TPU compiler, without owning one"
DESCRIPTION = "Compile the model's training step ahead of time for a TPU topology, per layout."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The plan command's flags: the model, --price, then every section's (the search's in a group)."""
    from tpu_tuner.planner.options import SECTIONS, PlanSearch, PlanStore

    parser.add_argument(
        "model_file",
        type=_model_source,
        help="a training workload (native contract, with loss()), a decoder shape (shape.toml or "
        "decoder:d_model=...), or a Hugging Face config: hf:./folder, hf:org/name, "
        'hf:llama?hidden_size=512,... (docs/planner.md, "Planning a Hugging Face model")',
    )
    parser.add_argument(
        "--price",
        action="append",
        metavar="GEN=USD_PER_CHIP_HOUR",
        help="a generation's on-demand price per chip-hour for the ranking of several topologies, "
        "e.g. v6e=2.70 (repeatable or comma-separated; overrides tpu_tuner/planner/tpu_prices.toml)",
    )
    search = parser.add_argument_group("search (Optuna over layout x remat x micro-batches)")
    for section in SECTIONS.values():
        add_section(search if section in (PlanSearch, PlanStore) else parser, section)
    add_out(parser)


def _model_source(text: str) -> str | Path:
    """The model argument: an ``hf:`` source stays the text as written (a Path would turn
    ``hf:./Llama-3.1-70B/`` into ``hf:Llama-3.1-70B``, no longer a folder's name); else a path."""
    return text if text.startswith("hf:") else Path(text)


def run(args: argparse.Namespace) -> int:
    """Check the flags, plan into a run folder, print the ranking."""
    from tpu_tuner.core.run_folder import COMPILER_LOG, PLAN_JSON, PLAN_MD, PLAN_PNG, SHARDING_CONFIG
    from tpu_tuner.outputs.plan_report import render_terminal
    from tpu_tuner.outputs.write import plan_to_folder
    from tpu_tuner.planner.options import SECTIONS, PlanOptions, PlanTarget

    topologies, prices = _ranking_flags(args)  # a list of topologies ranks them (docs/planner.md, "Which TPU to rent")
    sections = sections_from(args, {name: cls for name, cls in SECTIONS.items() if cls is not PlanTarget})
    # Each section checks itself, PlanOptions what spans them; a ranking plans every topology.
    options = PlanOptions(PlanTarget(topologies[0], args.slices), **sections)
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
    if args.layouts:
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
