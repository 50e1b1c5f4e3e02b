"""`tpu-tune plan`'s options: frozen sections, each checking itself and naming its flags.

`target` (the slice), `step` (the training step planned), `enumeration` (the layouts compiled
without a search), `compile` (the compiler processes and the prediction), `search` (Optuna over
the joint space) and `store` (the study). Immutable: a run derives what it needs (the folder's
storage and compiler log) with `dataclasses.replace`; `tpu-tune plan`'s flags are generated from
the fields (`tpu_tuner.core.flags`).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import get_type_hints

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.field_types import check_field_types
from tpu_tuner.core.flags import (
    SAMPLER,
    SEED,
    STORAGE,
    STUDY,
    at_least,
    comma_list,
    option,
    positive,
    uses,
)
from tpu_tuner.model.meshes.layouts import Layout, parse_layout
from tpu_tuner.planner.calibration.calibration_store import calibrated_cost_model
from tpu_tuner.planner.compiler.pool_defaults import COMPILE_TIMEOUT_S, default_workers
from tpu_tuner.planner.compiler.remat import parse_remat
from tpu_tuner.planner.compiler.xla_flags import parse_xla_flags
from tpu_tuner.planner.plans.plan_space import (
    DEFAULT_ACCUMULATIONS,
    DEFAULT_CONTEXTS,
    DEFAULT_REMATS,
    PlanSpace,
    flash_block_refusal,
)
from tpu_tuner.planner.plans.step_options import PlanStep
from tpu_tuner.planner.prediction.predict import CostModel, quantized_peak_refusal
from tpu_tuner.planner.topology import Topology, parse_slices

PLAN_SAMPLERS = ("tpe", "random", "grid")  # the tuner's names (studies/samplers.py); grid: every valid point, in order


def comma_ints(flag_name: str, text: str) -> tuple[int, ...]:
    """--accumulations / --contexts / --flash-blocks: whole numbers separated by commas (PlanSearch checks them)."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError as exc:
        raise UserInputError(f"{flag_name} takes whole numbers separated by commas, not {text!r}") from exc


def _layouts(texts: list[str]) -> list[Layout]:
    """--layout, repeated."""
    try:
        return [parse_layout(text) for text in texts]
    except ValueError as exc:
        raise UserInputError(f"--layout takes DATAxFSDPxTENSOR[xCONTEXT][,AXIS=N...], e.g. 1x64x4: {exc}") from exc


@dataclass(frozen=True)
class PlanTarget:
    """The TPU slice planned for, and how many of them DCN joins (multi-slice; docs/planner.md, "The whole mesh")."""

    topology: str = option(
        MISSING,
        "--topology",
        required=True,
        help="v5p-256, v6e-64, v5e-16, tpu7x-128, or v5p:8x8x8; several separated by commas "
        "(v5e-256,v5p-128,v6e-256) plans each and ranks them by tokens/s per chip and per dollar",
    )
    slices: int = option(
        1,
        "--slices",
        type=int,
        metavar="N",
        help="N such slices joined by the data-center network (multi-slice; default %(default)s): "
        "layouts then say which axes cross slices, e.g. 2x64x1,dcn_data=2",
    )

    def __post_init__(self) -> None:
        check_field_types(self)  # the Python API may pass any value
        parse_slices(self.topology, self.slices)

    @property
    def topologies(self) -> list[str]:
        """The slices named: one, or several a ranking plans each (docs/planner.md, "Which TPU to rent")."""
        return [topology.name for topology in parse_slices(self.topology, self.slices)]

    def slice(self) -> Topology:
        """The slice planned, `slices` times over DCN (several are ranked, each planned as its own target)."""
        first, *more = parse_slices(self.topology, self.slices)
        if more:
            raise UserInputError(f"--topology {self.topology!r} names several slices: plan one, or rank them")
        return first


@dataclass(frozen=True)
class PlanEnumeration:
    """The layouts compiled without a search: the first `max_layouts` enumerated, or `layouts`."""

    max_layouts: int = option(10, "--max-layouts", type=int, help="layouts to compile (default %(default)s)")
    layouts: list[Layout] | None = option(
        None,
        "--layout",
        append=True,
        convert=_layouts,
        metavar="DATAxFSDPxTENSOR[xCONTEXT][,AXIS=N...]",
        help="compile only this layout, e.g. 1x64x4, 1x32x4x2, 1x32x1,expert=4 or 2x64x1,dcn_data=2; "
        "AXIS: fsdp_transpose, expert, dcn_data, dcn_fsdp (repeatable)",
    )

    def __post_init__(self) -> None:
        check_field_types(self)  # the Python API may pass any value
        at_least(1, ("--max-layouts", self.max_layouts))


@dataclass(frozen=True)
class PlanCompile:
    """The compiler processes and what their output is judged by."""

    workers: int = option(
        default_workers,
        "--workers",
        type=int,
        help="compiler processes at once (default: one per core, at most 4)",
        factory=True,
    )
    fast_compile: bool = option(
        False,
        "--fast",
        help="screen layouts with the compiler's least optimisation effort: 2-4x quicker, same FLOPs "
        "and collectives, but temporaries (so 'fits') overstated; see docs/planner.md",
    )
    xla_flags: tuple[tuple[str, bool | int | str], ...] = option(
        (),
        "--xla-flags",
        metavar='"--xla_NAME=VALUE ..."',
        convert=parse_xla_flags,
        help='a recipe\'s XLA / libtpu flags as in LIBTPU_INIT_ARGS, written --xla-flags="--xla_NAME=VALUE ...", '
        "passed to every compile: they change its memory and schedule",
    )
    compile_timeout_s: float = option(
        COMPILE_TIMEOUT_S,
        "--compile-timeout",
        metavar="SECONDS",
        type=float,
        help="a compile still running after this many seconds has its process killed and its point marked "
        "failed, the plan goes on (default %(default)g: the longest seen, a 26B MoE, took 674 s)",
    )
    log_file: Path | None = None  # the compiler processes' output (libtpu's logs); None: the terminal
    cost_model: CostModel = field(default_factory=calibrated_cost_model)  # fitted to the published rows

    def __post_init__(self) -> None:
        check_field_types(self)  # the Python API may pass any value
        at_least(1, ("--workers", self.workers))
        positive(("--compile-timeout", self.compile_timeout_s))


@dataclass(frozen=True)
class PlanSearch:
    """The search (planner/plans/plan_search.py): with a budget, Optuna picks `budget` points of the joint
    space to compile instead of the layout enumeration; `space` None: space.default_space with
    the three axes below."""

    budget: int | None = option(
        None,
        "--budget",
        type=int,
        metavar="N",
        help="search the joint space with N compiles instead of enumerating layouts",
    )
    space: PlanSpace | None = None
    remats: tuple[str, ...] = option(
        DEFAULT_REMATS,
        "--remats",
        metavar="P1,P2,...",
        convert=lambda text: tuple(parse_remat(r, "--remats").name for r in comma_list(text)),
        help=f"the remat policies to search (default: the {len(DEFAULT_REMATS)} of docs/planner.md)",
    )
    accumulations: tuple[int, ...] = option(
        DEFAULT_ACCUMULATIONS,
        "--accumulations",
        metavar="N1,N2,...",
        convert=lambda text: comma_ints("--accumulations", text),
        help=f"micro-batch counts to search (default {','.join(map(str, DEFAULT_ACCUMULATIONS))})",
    )
    contexts: tuple[int, ...] = option(
        DEFAULT_CONTEXTS,
        "--contexts",
        metavar="N1,N2,...",
        convert=lambda text: comma_ints("--contexts", text),
        help=f"context-parallel sizes to search (default {','.join(map(str, DEFAULT_CONTEXTS))})",
    )
    flash_blocks: tuple[int, ...] = option(
        (),
        "--flash-blocks",
        metavar="N1,N2,...",
        convert=lambda text: comma_ints("--flash-blocks", text),
        help="flash kernel block sizes to search, e.g. 128,256,512 (default: no such axis, --flash-block's)",
    )
    sampler: str = uses(
        "tpe",
        SAMPLER,
        choices=PLAN_SAMPLERS,
        help="tpe, random, or grid (every valid point; --budget optional); default %(default)s",
    )
    seed: int = uses(0, SEED)

    def __post_init__(self) -> None:
        check_field_types(self)  # the Python API may pass any value
        if self.sampler not in PLAN_SAMPLERS:
            raise UserInputError(f"unknown plan sampler {self.sampler!r} (known: {', '.join(PLAN_SAMPLERS)})")
        at_least(1, ("--budget", self.budget))
        if self.seed < 0:
            raise UserInputError(f"--seed must be 0 or more, not {self.seed}")
        for policy in self.remats:
            parse_remat(policy, "--remats")
        for name, sizes in (("--accumulations", self.accumulations), ("--contexts", self.contexts)):
            if not sizes or min(sizes) < 1:
                raise UserInputError(f"{name} takes sizes of at least 1, not {','.join(map(str, sizes))!r}")
        if self.flash_blocks and min(self.flash_blocks) < 1:
            raise UserInputError(f"--flash-blocks takes sizes of at least 1, not {self.flash_blocks}")

    @property
    def active(self) -> bool:
        """Whether the plan searches (a budget, or the grid sampler) rather than enumerates."""
        return self.budget is not None or self.sampler == "grid"


@dataclass(frozen=True)
class PlanStore:
    """The search's Optuna study: its name (None: one derived from the plan's inputs, so the same
    plan run again resumes) and storage URL (None: in memory; plan_to_folder gives one)."""

    study: str | None = uses(
        None,
        STUDY,
        metavar=None,
        help="the study's name (default: one derived from the plan's inputs, so the same plan run again resumes)",
    )
    url: str | None = uses(None, STORAGE, help="Optuna storage URL (default: $TPU_TUNE_STORAGE, else results/plans.db)")


@dataclass(frozen=True)
class PlanOptions:
    """What to plan and how: the layout enumeration, or with a search budget (or the grid
    sampler) the search over the joint space (``PlanOptions(PlanTarget("v5e-4"))``)."""

    target: PlanTarget
    step: PlanStep = field(default_factory=PlanStep)
    enumeration: PlanEnumeration = field(default_factory=PlanEnumeration)
    compile: PlanCompile = field(default_factory=PlanCompile)
    search: PlanSearch = field(default_factory=PlanSearch)
    store: PlanStore = field(default_factory=PlanStore)

    def __post_init__(self) -> None:
        """What spans sections: the layouts' slices, an 8-bit peak for the slice's generation,
        and the search's flags only with a search (refused before any compiler starts)."""
        check_field_types(self)  # the Python API may pass any value
        target, search = self.target, self.search
        first, *more = parse_slices(target.topology, target.slices)
        if more and self.enumeration.layouts:
            raise UserInputError(
                "--layout names layouts of one slice's devices: give one --topology, or leave out --layout"
            )
        for layout in self.enumeration.layouts or ():
            first.check_layout(layout)
        quantization = self.step.quantization
        if quantization is not None:
            # A ranking's other slices are checked as each is planned (a refusal ranks that slice unplanned).
            refusal = quantized_peak_refusal(first.chip.generation, quantization)
            if refusal:
                raise UserInputError(f"--quantization {quantization} on {first.name}: {refusal}")
        search_only = [
            name
            for name, given in (
                ("--remats", search.remats != DEFAULT_REMATS),
                ("--accumulations", search.accumulations != DEFAULT_ACCUMULATIONS),
                ("--contexts", search.contexts != DEFAULT_CONTEXTS),
                ("--flash-blocks", bool(search.flash_blocks)),
                ("--study", self.store.study is not None),
                ("--storage", self.store.url is not None),
            )
            if given
        ]
        if search.flash_blocks and self.step.flash_block is not None:
            raise UserInputError("--flash-block fixes the blocks --flash-blocks searches: give one of them")
        for block in search.flash_blocks if self.step.seq_len else ():  # else checked when the model is read
            refusal = flash_block_refusal(block, self.step.seq_len or 0)
            if refusal:
                raise UserInputError(f"--flash-blocks: {refusal}")
        if not search.active and search_only:
            raise UserInputError(
                f"{', '.join(search_only)} set(s) the search's space or study: give --budget N (or --sampler grid)"
            )
        if search.active and self.enumeration.layouts:
            raise UserInputError(
                "--layout names the layouts to compile instead of a search: leave out --budget, or "
                "give the search's axes (--contexts, --remats, --accumulations)"
            )


# The sections by attribute name: PlanOptions' fields, each typed by its section's class.
SECTIONS: dict[str, type] = get_type_hints(PlanOptions)

__all__ = [
    "PLAN_SAMPLERS",
    "SECTIONS",
    "PlanCompile",
    "PlanEnumeration",
    "PlanOptions",
    "PlanSearch",
    "PlanStep",
    "PlanStore",
    "PlanTarget",
    "comma_ints",
]
