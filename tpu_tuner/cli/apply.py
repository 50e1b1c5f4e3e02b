"""`tpu-tune apply`: the Python that applies a tuned config, printed so that it runs as printed."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "apply"
HELP = "print the Python that applies a tuned config (runs as printed)"
DESCRIPTION = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The config file."""
    parser.add_argument("config", type=Path, help="a tuned_config.toml")


def run(args: argparse.Namespace) -> int:
    """Print the instructions of the tuned config."""
    from tpu_tuner.knobs.tuned_config import TunedConfig

    config = TunedConfig.load(args.config)
    print(f"# {args.config}: Python that applies it")
    print("\n".join(config.instructions(args.config)))
    return 0
