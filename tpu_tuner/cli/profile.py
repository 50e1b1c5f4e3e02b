"""`tpu-tune profile`: one step of a model file measured on the present device."""

from __future__ import annotations

import argparse

from tpu_tuner.cli.common import add_run_args, device_or_none
from tpu_tuner.knobs.autocast import AUTOCAST_DTYPES
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.matmul_precision import MATMUL_PRECISIONS

NAME = "profile"
HELP = "measure step time, FLOPs, MFU, memory, compilations and top operators"
DESCRIPTION = "Profile one step of a model file on the present device."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The profile command's flags."""
    add_run_args(parser)
    parser.add_argument(
        "--precision",
        choices=MATMUL_PRECISIONS,
        help="torch.set_float32_matmul_precision (default: the device's own: highest on CPU and "
        "GPU, medium on TPU, TorchTPU's one-pass default)",
    )
    parser.add_argument("--autocast", choices=AUTOCAST_DTYPES, help="run under torch.autocast with this dtype")
    parser.add_argument("--compile", metavar="BACKEND", help="torch.compile backend (inductor, aot_eager, tpu, ...)")
    parser.add_argument("--compile-mode", help="torch.compile mode (inductor only), e.g. max-autotune")
    parser.add_argument(
        "--eager-mode",
        choices=("strict", "debug", "defer_and_fuse"),
        default="strict",
        help="TorchTPU eager mode (TPU only)",
    )
    parser.add_argument(
        "--attention",
        choices=("full", "causal"),
        default="full",
        help="attention FLOPs convention for MFU: full (PaLM/torchtitan, default) or causal (MaxText)",
    )
    parser.add_argument("--agent", default="profiler", help="profiler agent definition: a name or a TOML path")


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
    from tpu_tuner.knobs.matmul_precision import device_default
    from tpu_tuner.outputs.profile_report import render_terminal
    from tpu_tuner.outputs.write import save_profile
    from tpu_tuner.profiling.settings import ProfilerSettings
    from tpu_tuner.runner.isolated_profile import profile_in_worker
    from tpu_tuner.runner.worker_log import WorkerLog

    candidate = Candidate.from_fields(  # the profile command's flags name the pre-registry fields
        eager_mode=args.eager_mode,
        compile_backend=args.compile,
        compile_mode=args.compile_mode,
        matmul_precision=args.precision or device_default(_likely_device_kind(args.device)),
        autocast_dtype=args.autocast,
    )
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
