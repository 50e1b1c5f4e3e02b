"""`tpu-tune plan`: rank sharding layouts for a TPU slice with the TPU compiler (JAX compile-only).

Flags are generated from `PlanOptions`' sections (planner/plans/plan_options.py), which state their names,
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
    from tpu_tuner.planner.plans.plan_options import SECTIONS, PlanSearch, PlanStore

    parser.add_argument(
        "model_file",
        type=model_source,
        help="a training workload (native contract, with loss()), a decoder shape (shape.toml or "
        "decoder:d_model=...), or a Hugging Face config: hf:./folder, hf:org/name, "
        'hf:llama?hidden_size=512,... (docs/planner.md, "Planning a Hugging Face model")',
    )
    parser.add_argument(
        "--price",
        action="append",
        metavar="GEN=USD_PER_CHIP_HOUR",
        help="a generation's on-demand price per chip-hour for the ranking of several topologies, "
        "e.g. v6e=2.70 (repeatable or comma-separated; overrides tpu_tuner/planner/plans/tpu_prices.toml)",
    )
    search = parser.add_argument_group("search (Optuna over layout x remat x micro-batches)")
    for section in SECTIONS.values():
        add_section(search if section in (PlanSearch, PlanStore) else parser, section)
    add_out(parser)


def model_source(text: str) -> str | Path:
    """The model argument: an ``hf:`` source stays the text as written (a Path would turn
    ``hf:./Llama-3.1-70B/`` into ``hf:Llama-3.1-70B``, no longer a folder's name); else a path."""
    return text if text.startswith("hf:") else Path(text)


def run(args: argparse.Namespace) -> int:
    """Check the flags, plan into a run folder, print the ranking."""
    from tpu_tuner.core.run_folder import COMPILER_LOG, PLAN_JSON, PLAN_MD, PLAN_PNG, SHARDING_CONFIG
    from tpu_tuner.outputs.plan_report import render_terminal
    from tpu_tuner.plan_api import plan_to_folder
    from tpu_tuner.planner.plans.plan_options import SECTIONS, PlanOptions

    # Each section checks itself (the target every slice --topology names), PlanOptions what spans them.
    options = PlanOptions(**sections_from(args, SECTIONS))
    prices = _prices(args, options.target.topologies)
    if len(options.target.topologies) > 1:  # a ranking plans each (docs/planner.md, "Which TPU to rent")
        return _rank(args, options, prices)
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


def _prices(args: argparse.Namespace, topologies: list[str]) -> dict[str, Any]:
    """The prices a ranking of several `topologies` uses; --price without one is refused in one line."""
    from tpu_tuner.core.errors import UserInputError
    from tpu_tuner.planner.plans.prices import parse_price_flags, price_table

    given = parse_price_flags(args.price)
    if len(topologies) == 1:
        if given:
            raise UserInputError(
                "--price prices the ranking of several topologies: give --topology A,B,... (e.g. v5e-256,v6e-256)"
            )
        return {}
    return price_table(given)


def _rank(args: argparse.Namespace, options: Any, prices: dict[str, Any]) -> int:
    """Plan every topology of the target with the same options, then print the ranking."""
    from tpu_tuner.outputs.ranking_report import render_terminal
    from tpu_tuner.plan_api import rank_to_folder

    folder, ranking = rank_to_folder(
        args.model_file,
        options,
        options.target.topologies,
        prices,
        args.out,
        progress=lambda message: print(message, flush=True),
    )
    print()
    print(render_terminal(ranking.to_dict(), str(folder)))
    return 0
