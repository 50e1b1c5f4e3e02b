"""`tpu-tune buckets`' options: frozen sections, each checking itself and naming its flags.

`choice` (the length sample and the limits the optimiser respects), `measure` (where and how the
cost model is measured) and `replay` (the end-to-end replay of every strategy); `tpu-tune buckets`'
flags are generated from the fields (`tpu_tuner.core.flags`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import get_type_hints

from tpu_tuner.core.field_types import check_field_types
from tpu_tuner.core.flags import BATCH_SIZE, DEVICE, LENGTHS, MAX_BUCKETS, at_least, option, positive, uses


@dataclass(frozen=True)
class BucketChoice:
    """The length sample, the planned run and the limits the buckets are chosen under."""

    lengths_file: Path | None = uses(None, LENGTHS)
    planned_steps: int = option(20_000, "--steps", type=int, help="steps of the planned run (default %(default)s)")
    max_buckets: int = uses(8, MAX_BUCKETS)
    align: int = option(
        8, "--align", type=int, help="bounds are multiples of this (default %(default)s; 128 on TPU matmul units)"
    )

    def __post_init__(self) -> None:
        check_field_types(self)  # the Python API may pass any value
        at_least(1, ("--steps", self.planned_steps), ("--max-buckets", self.max_buckets), ("--align", self.align))


@dataclass(frozen=True)
class BucketMeasurement:
    """Where the cost model is measured: device, compile backend, batch, each worker's time limit."""

    device: str | None = uses(None, DEVICE)
    compile_backend: str | None = option(
        None, "--compile-backend", help="torch.compile backend to measure (default: the device's: inductor / tpu)"
    )
    batch_size: int | None = uses(None, BATCH_SIZE)
    trial_timeout_s: float = 3600.0

    def __post_init__(self) -> None:
        check_field_types(self)  # the Python API may pass any value
        at_least(1, ("--batch-size", self.batch_size))
        positive(("trial_timeout_s", self.trial_timeout_s))


@dataclass(frozen=True)
class BucketReplay:
    """The end-to-end replay: `steps` lengths drawn (with `seed`) and run per strategy; 0: none."""

    steps: int = option(
        0,
        "--replay",
        type=int,
        metavar="N",
        help="also replay N drawn steps through the workload per strategy and report measured totals",
    )
    heldout_file: Path | None = option(
        None,
        "--heldout-lengths",
        metavar="FILE",
        type=Path,
        help="also cost the chosen buckets on a held-out length sample they were not chosen on, beside "
        "strategies made from it (as --lengths reads it); with --replay the replayed stream is drawn from it",
    )
    max_compiles: int = 16  # strategies needing more compiled shapes are predicted only
    only: tuple[str, ...] | None = None  # replay just these strategies (names as in the table)
    seed: int = 0

    def __post_init__(self) -> None:
        check_field_types(self)  # the Python API may pass any value
        at_least(0, ("--replay", self.steps))


@dataclass(frozen=True)
class BucketOptions:
    """What `tpu-tune buckets` measures and optimises, with the documented defaults."""

    choice: BucketChoice = field(default_factory=BucketChoice)
    measure: BucketMeasurement = field(default_factory=BucketMeasurement)
    replay: BucketReplay = field(default_factory=BucketReplay)


# The sections by attribute name: BucketOptions' fields, each typed by its section's class.
SECTIONS: dict[str, type] = get_type_hints(BucketOptions)

__all__ = ["SECTIONS", "BucketChoice", "BucketMeasurement", "BucketOptions", "BucketReplay"]
