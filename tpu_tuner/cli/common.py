"""What the `tpu-tune` subcommands share: a dataclass's default read once, and the run arguments."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from tpu_tuner.core.run_folder import RESULTS_DIR


def default_of(cls: type, name: str) -> Any:
    """The default of field `name` of the options dataclass `cls`: flags take their defaults from
    the options they set, so that each default is stated once."""
    found = {f.name: f for f in dataclasses.fields(cls)}[name]
    if found.default is not dataclasses.MISSING:
        return found.default
    if found.default_factory is not dataclasses.MISSING:
        return found.default_factory()
    raise ValueError(f"{cls.__name__}.{name} has no default")


def add_out(parser: argparse.ArgumentParser) -> None:
    """--out, the results folder."""
    parser.add_argument("--out", type=Path, default=Path(RESULTS_DIR), help="results folder (default: %(default)s/)")


def add_run_args(parser: argparse.ArgumentParser) -> None:
    """Arguments every command that runs the model shares: the file, device, sizes, output."""
    parser.add_argument("model_file", type=Path, help="a model file (native contract or benchmark convention)")
    parser.add_argument("--device", default="auto", help="auto (default), tpu, cuda or cpu")
    parser.add_argument("--batch-size", type=int, help="batch size (default: the file's BATCH_SIZE)")
    parser.add_argument("--seq-len", type=int, help="sequence length (default: the file's SEQ_LEN)")
    add_out(parser)


def device_or_none(device: str) -> str | None:
    """`--device auto` is the options' None: the best device present."""
    return None if device == "auto" else device
