"""`tpu-tune buckets`: shape buckets for inputs of varying length (few compiles, little padding).

Flags take their defaults from `BucketOptions` (bucketing/study.py), read when this command's
parser is built.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tpu_tuner.cli.common import add_hf_args, add_out, default_of

NAME = "buckets"
HELP = "choose shape buckets for inputs of varying length (few compiles, little padding)"
DESCRIPTION = (
    "Measure compile and step costs on this device, then choose the bucket bounds that minimise a planned "
    "run's total time; compare with the usual strategies."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The buckets command's flags, their defaults read from `BucketOptions`."""
    from tpu_tuner.bucketing.study import BucketOptions

    def default(name: str) -> Any:
        return default_of(BucketOptions, name)

    parser.add_argument("model_file", type=Path, help="a workload whose make_batch(batch, seq_len) takes any length")
    add_hf_args(parser)
    parser.add_argument(
        "--lengths",
        dest="lengths_file",
        metavar="LENGTHS",
        type=Path,
        default=default("lengths_file"),
        help="length sample: CSV (a 'length' column) or one number a line (default: the file's sample_lengths())",
    )
    parser.add_argument(
        "--steps", type=int, default=default("steps"), help="steps of the planned run (default %(default)s)"
    )
    parser.add_argument(
        "--max-buckets",
        type=int,
        default=default("max_buckets"),
        help="most compiled shapes allowed (default %(default)s)",
    )
    parser.add_argument(
        "--align",
        type=int,
        default=default("align"),
        help="bounds are multiples of this (default %(default)s; 128 on TPU matmul units)",
    )
    parser.add_argument("--device", default=default("device"), help="cpu, cuda, tpu (default: the best present)")
    parser.add_argument(
        "--compile-backend",
        default=default("compile_backend"),
        help="torch.compile backend to measure (default: the device's: inductor / tpu)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=default("batch_size"),
        help="sequences per step (default: the file's BATCH_SIZE)",
    )
    parser.add_argument(
        "--replay",
        dest="replay_steps",
        type=int,
        default=default("replay_steps"),
        metavar="N",
        help="also replay N drawn steps through the workload per strategy and report measured totals",
    )
    add_out(parser)


def run(args: argparse.Namespace) -> int:
    """Measure, choose and compare buckets; write the run folder and print the table."""
    from tpu_tuner.bucketing.study import BucketOptions, plan_buckets
    from tpu_tuner.core.run_folder import new_run_dir
    from tpu_tuner.outputs.bucket_report import render_terminal
    from tpu_tuner.outputs.write import write_buckets
    from tpu_tuner.runner.worker_log import WorkerLog

    options = BucketOptions(
        lengths_file=args.lengths_file,
        steps=args.steps,
        max_buckets=args.max_buckets,
        align=args.align,
        device=args.device,
        compile_backend=args.compile_backend,
        batch_size=args.batch_size,
        replay_steps=args.replay_steps,
    )
    # What the workers' libraries print goes to the folder's workers.log, not the terminal.
    with WorkerLog() as workers_log:
        result = plan_buckets(
            args.model_file, options, progress=lambda message: print(message, flush=True), workers_log=workers_log
        )
        run_dir = new_run_dir(args.out, result.workload, "buckets")
        written = write_buckets(run_dir, result, args.model_file)
        workers_log.move_into(run_dir)
    print()
    print(render_terminal(result))
    print(f"\nwrote {run_dir}/ ({', '.join(written)})")
    return 0
