"""The `tpu-tune` command line. The only module that prints to the terminal or exits."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from tpu_tuner.candidate import AUTOCAST_DTYPES, MATMUL_PRECISIONS, Candidate
from tpu_tuner.errors import TpuTuneError

log = logging.getLogger("tpu_tuner.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tpu-tune",
        description="Profile and tune PyTorch models for TPUs (TorchTPU), GPUs and CPUs.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors on stderr")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    prof = commands.add_parser(
        "profile",
        help="measure step time, FLOPs, MFU, memory, compilations and top operators",
        description="Profile one step of a model file on the present device.",
    )
    prof.add_argument("model_file", type=Path, help="a model file (native contract or benchmark convention)")
    prof.add_argument("--device", default="auto", help="auto (default), tpu, cuda or cpu")
    prof.add_argument("--batch-size", type=int, help="batch size (default: the file's BATCH_SIZE)")
    prof.add_argument("--seq-len", type=int, help="sequence length (default: the file's SEQ_LEN)")
    prof.add_argument("--precision", choices=MATMUL_PRECISIONS, default="highest",
                      help="torch.set_float32_matmul_precision (default: highest)")
    prof.add_argument("--autocast", choices=AUTOCAST_DTYPES, help="run under torch.autocast with this dtype")
    prof.add_argument("--compile", metavar="BACKEND", help="torch.compile backend (inductor, aot_eager, tpu, ...)")
    prof.add_argument("--compile-mode", help="torch.compile mode (inductor only), e.g. max-autotune")
    prof.add_argument("--eager-mode", choices=("strict", "debug", "defer_and_fuse"), default="strict",
                      help="TorchTPU eager mode (TPU only)")
    prof.add_argument("--attention", choices=("full", "causal"), default="full",
                      help="attention FLOPs convention for MFU: full (PaLM/torchtitan, default) or causal (MaxText)")
    prof.add_argument("--agent", default="profiler", help="profiler agent definition: a name or a TOML path")
    prof.add_argument("--out", type=Path, default=Path("results"), help="results folder (default: results/)")
    prof.set_defaults(handler=_profile_command)
    return parser


def _profile_command(args: argparse.Namespace) -> int:
    # Imported here so that `tpu-tune --help` stays fast.
    from tpu_tuner.profiling import ProfilerSettings, profile
    from tpu_tuner.report.profile_report import render_markdown, render_terminal
    from tpu_tuner.results import new_run_dir

    candidate = Candidate(
        eager_mode=args.eager_mode,
        compile_backend=args.compile,
        compile_mode=args.compile_mode,
        matmul_precision=args.precision,
        autocast_dtype=args.autocast,
    )
    result = profile(
        args.model_file,
        device=None if args.device == "auto" else args.device,
        candidate=candidate,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        attention_convention=args.attention,
        settings=ProfilerSettings.load(args.agent),
    )
    run_dir = new_run_dir(args.out, result.workload["name"])
    (run_dir / "profile.json").write_text(result.to_json())
    (run_dir / "profile.md").write_text(render_markdown(result))
    print(render_terminal(result))
    print(f"\nwrote {run_dir / 'profile.json'} and {run_dir / 'profile.md'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tpu-tune` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.debug else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return args.handler(args)
    except TpuTuneError as exc:
        if args.debug:
            raise
        print(f"tpu-tune: error: {exc}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        print("tpu-tune: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
