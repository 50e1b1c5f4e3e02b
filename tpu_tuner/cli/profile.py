"""`tpu-tune profile`: one step of a model file measured on the present device."""

from __future__ import annotations

import argparse

from tpu_tuner.cli.common import add_run_args
from tpu_tuner.core.flags import device_or_none
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.capabilities import Flag, PickedByFlags
from tpu_tuner.knobs.registry import REGISTRY

NAME = "profile"
HELP = "measure step time, FLOPs, MFU, memory, compilations and top operators"
DESCRIPTION = "Profile one step of a model file on the present device."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The profile command's flags: the knobs' own (`PickedByFlags`), then the profile's."""
    add_run_args(parser)
    for flag in _knob_flags():
        parser.add_argument(flag.option, dest=flag.field, choices=flag.choices, metavar=flag.metavar, help=flag.help)
    parser.add_argument(
        "--attention",
        choices=("full", "causal"),
        default="full",
        help="attention FLOPs convention for MFU: full (PaLM/torchtitan, default) or causal (MaxText)",
    )
    parser.add_argument("--agent", default="profiler", help="profiler agent definition: a name or a TOML path")


def _knob_flags() -> list[Flag]:
    return [flag for knob in REGISTRY.values() if isinstance(knob, PickedByFlags) for flag in knob.flags]


def _likely_device_kind(device: str) -> str:
    """The device kind `--device` names, or for auto "tpu" where this host has a TPU chip and
    torch-tpu (the backend the worker will pick), else "other" (read without importing torch)."""
    if device != "auto":
        return device
    from tpu_tuner.core.tpu_host import torch_tpu_installed, tpu_chips_on_host

    return "tpu" if tpu_chips_on_host() and torch_tpu_installed() else "other"


def run(args: argparse.Namespace) -> int:
    """Profile in a worker, write profile.json and profile.md, print the table."""
    # Imported here so that `tpu-tune --help` stays fast.
    from tpu_tuner.core.run_folder import PROFILE_JSON, PROFILE_MD
    from tpu_tuner.outputs.profile_report import render_terminal
    from tpu_tuner.outputs.write import save_profile
    from tpu_tuner.profiling.settings import ProfilerSettings
    from tpu_tuner.runner.isolated_profile import profile_in_worker
    from tpu_tuner.runner.worker_log import WorkerLog

    # A knob none of whose flags is given runs the device's baseline (TorchTPU's matmul precision).
    fields = {flag.field: getattr(args, flag.field) for flag in _knob_flags()}
    candidate = Candidate.from_fields(fields, _likely_device_kind(args.device))
    # The model file runs in a worker, never in this process (docs/run-safety.md); what its
    # libraries print goes to the folder's workers.log, not the terminal.
    with WorkerLog() as workers_log:
        result = profile_in_worker(
            args.model_file,
            candidate,
            device_or_none(args.device),
            args.batch_size,
            args.seq_len,
            args.attention,
            ProfilerSettings.load(args.agent),
            log=workers_log,
        )
        run_dir = save_profile(result, args.out)
        workers_log.move_into(run_dir)
    print(render_terminal(result))
    print(f"\nwrote {run_dir / PROFILE_JSON} and {run_dir / PROFILE_MD}")
    return 0
