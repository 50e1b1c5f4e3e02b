"""What the `tpu-tune` subcommands share: the model argument and the run arguments."""

from __future__ import annotations

import argparse
from pathlib import Path

from tpu_tuner.core.flags import BATCH_SIZE, DEVICE, OUT, SEQ_LEN, add_flag
from tpu_tuner.core.run_folder import RESULTS_DIR


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """The model to run: a file, a decoder shape or a Hugging Face model (with --inference, --weights)."""
    parser.add_argument(
        "model_file",
        type=Path,
        help="a model file (native contract or benchmark convention), a "
        "decoder shape, or a Hugging Face model: hf:./folder, hf:org/name, hf:llama?hidden_size=512",
    )
    add_hf_args(parser)


def add_out(parser: argparse.ArgumentParser) -> None:
    """--out, the results folder."""
    add_flag(parser, OUT, "out", Path(RESULTS_DIR))


def add_run_args(parser: argparse.ArgumentParser) -> None:
    """Arguments of a command that runs the model without options sections (`profile`): the
    model, device, sizes, output, as `tune` names them."""
    add_model_args(parser)
    add_flag(parser, DEVICE, "device")
    add_flag(parser, BATCH_SIZE, "batch_size")
    add_flag(parser, SEQ_LEN, "seq_len")
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
    from tpu_tuner.model.workloads.hf_source import is_hf_source, parse

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
    from tpu_tuner.model.workloads.hf_workload import check_source

    text = parse(str(args.model_file)).with_options(inference=inference, weights=weights)
    check_source(text)
    return Path(text)


def check_lengths(args: argparse.Namespace) -> None:
    """Read a --lengths file before anything loads the model, so a bad one costs no worker start
    (`UserInputError` naming the file and line)."""
    if getattr(args, "lengths_file", None) is not None:
        from tpu_tuner.model.buckets.lengths import read_lengths

        read_lengths(args.lengths_file)


__all__ = [
    "add_hf_args",
    "add_model_args",
    "add_out",
    "add_run_args",
    "check_lengths",
    "model_source",
]


def quiet_optuna(debug: bool) -> None:
    """Optuna's own INFO lines (a study created, each trial told) off the terminal, which holds
    the command's progress lines (all of them with --debug). The CLI's choice, made once Optuna is
    imported (after the options are checked): the library leaves Optuna's logging as it is."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.DEBUG if debug else optuna.logging.WARNING)


def dashboard_lines(run_dir: Path, storage: str) -> list[str]:
    """Where to look at a finished run: tpu-tune's own dashboard of its results folder, and
    Optuna's over the study where optuna-dashboard is installed (the `postgres` extra installs it;
    it is not suggested where it would only fail): by URL where Optuna opens the storage, through
    `tpu-tune study dashboard` for a PostgreSQL journal, which it cannot open by URL."""
    import importlib.util

    from tpu_tuner.core.credentials import redact
    from tpu_tuner.studies.storage import keeps_journal

    lines = [f"dashboard tpu-tune dashboard {run_dir.parent}"]
    if importlib.util.find_spec("optuna_dashboard") is None or "://" not in storage:
        return lines
    if keeps_journal(storage):
        lines.append(f"          tpu-tune study dashboard --storage {redact(storage)}")
    else:
        lines.append(f"          optuna-dashboard {redact(storage)}")
    return lines
