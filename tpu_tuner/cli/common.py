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
    parser.add_argument(
        "model_file",
        type=Path,
        help="a model file (native contract or benchmark convention), a "
        "decoder shape, or a Hugging Face model: hf:./folder, hf:org/name, hf:llama?hidden_size=512",
    )
    parser.add_argument("--device", default="auto", help="auto (default), tpu, cuda or cpu")
    parser.add_argument("--batch-size", type=int, help="batch size (default: the file's BATCH_SIZE)")
    parser.add_argument(
        "--seq-len", "--seq", dest="seq_len", type=int, help="sequence length (default: the file's SEQ_LEN)"
    )
    add_hf_args(parser)
    add_out(parser)


def add_hf_args(parser: argparse.ArgumentParser) -> None:
    """--inference and --weights, for a Hugging Face model (``hf:...``)."""
    parser.add_argument(
        "--inference",
        action="store_true",
        help="hf: models: time the forward pass (default: the training step with the model's own loss)",
    )
    parser.add_argument(
        "--weights",
        action="store_true",
        help="hf: models: load the checkpoint's weights (default: random weights from the config)",
    )


def model_source(args: argparse.Namespace) -> Path:
    """The model to run, with --inference / --weights written into an ``hf:`` source (so every
    worker rebuilds the same workload from it) after checking it names a config with a head to
    run, before any folder is made; `UserInputError` otherwise."""
    from tpu_tuner.core.errors import UserInputError
    from tpu_tuner.model.hf_source import is_hf_source, parse

    inference, weights = getattr(args, "inference", False), getattr(args, "weights", False)
    if not is_hf_source(args.model_file):
        if inference or weights:
            flag = "--inference" if inference else "--weights"
            raise UserInputError(
                f"{flag} is for Hugging Face models (hf:...); a model file is an inference step "
                "when it declares no loss()",
                args.model_file,
            )
        return args.model_file
    from tpu_tuner.model.hf_workload import check_source

    text = parse(str(args.model_file)).with_options(inference=inference, weights=weights)
    check_source(text)
    return Path(text)


def check_lengths(args: argparse.Namespace) -> None:
    """Read a --lengths file before anything loads the model, so a bad one costs no worker start
    (`UserInputError` naming the file and line)."""
    if getattr(args, "lengths_file", None) is not None:
        from tpu_tuner.model.lengths import read_lengths

        read_lengths(args.lengths_file)


def device_or_none(device: str) -> str | None:
    """`--device auto` is the options' None: the best device present."""
    return None if device == "auto" else device
