"""`tpu-tune devices`: each backend, available here or why not; versions; the TorchTPU API check."""

from __future__ import annotations

import argparse

NAME = "devices"
HELP = "each backend: available here or why not; installed versions; the TorchTPU API check"
DESCRIPTION = (
    "List the tpu, cuda and cpu backends (available here, or why not), the installed torch, torch-tpu, "
    "libtpu, jax, jaxlib and torchax, and check every TorchTPU name tpu-tune uses against the installed "
    "torch-tpu (exit status 1 when one is missing)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--json."""
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    """Print the report; exit status 1 when installed torch-tpu lacks a name the adapter uses."""
    import json

    from tpu_tuner.devices.listing import devices_report

    report = devices_report()
    print(json.dumps(report.to_dict(), indent=2) if args.json else "\n".join(report.lines()))
    # None installed is not an error; an incomplete one is (CI runs this).
    return 1 if report.torchtpu_api_ok is False else 0
