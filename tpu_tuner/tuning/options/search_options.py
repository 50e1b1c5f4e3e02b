"""The first two sections of a tuning run's options: what is searched, and what a setting is judged by.

Each checks itself when built (`UserInputError` naming the flag) and names its flags
(`tpu_tuner.core.flags`); `tuning/options/tune_options.py` holds them together as `TuneOptions`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.field_types import check_field_types
from tpu_tuner.core.flags import (
    LENGTHS,
    MAX_BUCKETS,
    SAMPLER,
    SEED,
    DefaultWords,
    at_least,
    option,
    positive,
    uses,
)
from tpu_tuner.core.units import parse_duration
from tpu_tuner.studies.samplers import SAMPLERS  # the sampler factory's own names

# The whole run's clock by default (--time-budget): search, race and verification (tuning/run/clock.py).
TIME_BUDGET = "4m"
# The longest a default clock is fitted to (tuning/run/fitted_clock.py).
LONGEST_FITTED_BUDGET = "20m"


class DefaultBudget(float):
    """The default clock's seconds, marked as the default (a float like any other), so that a run
    may fit it to what a setting costs on its device (tuning/run/fitted_clock.py); a budget the
    user gave is a plain float and is held to."""


@dataclass(frozen=True)
class SearchOptions:
    """What to search and for how long."""

    trials: int | None = option(
        None,
        "--trials",
        type=int,
        help="settings to measure, baseline and seeds included; repeats and rejections are free "
        "(default: 20%% of the space's settings no rule refuses unmeasured, 12 to 48; a grid: all of them)",
    )
    timeout_s: float | None = option(
        None,
        "--timeout",
        metavar="TIMEOUT",
        type=float,
        help="stop starting trials after this many seconds (the search alone; --time-budget counts the whole run)",
    )
    # Stop trials that are hopeless against the best so far (tuning/search/pruning.py).
    prune: bool = option(
        True, "--no-prune", help="measure every trial to the end, however far behind the best its first steps are"
    )
    time_budget_s: float | None = option(
        DefaultBudget(parse_duration(TIME_BUDGET) or 0.0),
        "--time-budget",
        metavar="DURATION",
        typed=DefaultWords(TIME_BUDGET),
        convert=parse_duration,
        help="the whole run's clock: search, race and verification fit in it, e.g. 10m, 90s, 1h30m; "
        "none: no clock, the trial budget alone (default %(default)s, on every device grown to hold 8 settings "
        f"and the verification at what the baseline's load and profile took, at most {LONGEST_FITTED_BUDGET})",
    )
    sampler: str = uses("tpe", SAMPLER, choices=tuple(SAMPLERS))
    seed: int = uses(0, SEED)
    space: str | Path = option("default", "--space", help="search space: a name in search_spaces/ or a TOML path")
    agents: tuple[str, ...] = ("compile", "precision", "threads", "memory", "sharding")
    # Enqueue the best settings of earlier studies of this device kind first (tuning/search/warm_start.py).
    warm_start: bool = option(
        True, "--cold", help="no warm start: do not enqueue the best settings of earlier studies first"
    )
    plan: Path | None = option(
        None,
        "--plan",
        type=Path,
        metavar="PLAN_DIR",
        help="with --nproc: seed the layouts a `tpu-tune plan` folder ranked first (mapped onto N ranks)",
    )

    def __post_init__(self) -> None:
        check_field_types(self)  # the Python API may pass any value
        if self.sampler not in SAMPLERS:
            raise UserInputError(f"unknown sampler {self.sampler!r}; choose {', '.join(SAMPLERS)}")
        at_least(1, ("--trials", self.trials))
        positive(("--timeout", self.timeout_s), ("--time-budget", self.time_budget_s))


@dataclass(frozen=True)
class ObjectiveOptions:
    """What a setting is judged by, and how the winner is verified.

    * ``planned_steps``: the length of the run the user plans; compile time is spread over it
      (amortised step time = steady step + compile time / planned_steps).
    * ``tolerance``: how much a config's relative error against the fp32 eager reference may
      exceed the baseline's (outputs for inference; loss and gradients for training); 1e-2 admits
      bf16 autocast on the examples (docs/tuning.md, "Accuracy against the baseline").
    * ``memory_limit_bytes``: the trial worker's address-space limit, and the memory a feasible
      setting may peak at; None: the device's memory.
    """

    planned_steps: int = option(
        5000,
        "--steps",
        metavar="STEPS",
        type=int,
        help="steps of the run you plan; compile time is spread over them (default %(default)s)",
    )
    tolerance: float = option(
        1e-2,
        "--tolerance",
        type=float,
        help="how much a config's relative error against fp32 eager may exceed the baseline's (default %(default)g)",
    )
    memory_limit_bytes: int | None = option(
        None,
        "--trial-memory-gb",
        type=float,
        convert=lambda gib: int(gib * 1024**3) if gib else None,
        help="address-space limit of the trial worker, GiB; also the study's memory constraint "
        "(a trial whose measured peak memory exceeds it is infeasible)",
    )
    verify_rounds: int = option(
        12, "--verify-rounds", type=int, help="interleaved rounds of the final comparison (default %(default)s)"
    )
    # Varying input lengths: tuning/search/bucketing_context.py.
    lengths_file: Path | None = uses(
        None,
        LENGTHS,
        help="input length sample (CSV or one number a line; default: the file's sample_lengths()); "
        "each trial's objective then includes its best shape buckets",
    )
    max_buckets: int = uses(8, MAX_BUCKETS)
    bucket_align: int = option(
        8, "--bucket-align", type=int, help="bucket bounds are multiples of this (default %(default)s)"
    )

    def __post_init__(self) -> None:
        check_field_types(self)  # the Python API may pass any value
        at_least(1, ("--steps", self.planned_steps), ("--max-buckets", self.max_buckets))
        at_least(1, ("--bucket-align", self.bucket_align))
        at_least(2, ("--verify-rounds", self.verify_rounds))
        positive(("--tolerance", self.tolerance))
        if self.memory_limit_bytes is not None and self.memory_limit_bytes <= 0:
            raise UserInputError("--trial-memory-gb must be positive")
