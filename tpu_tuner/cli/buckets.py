"""`tpu-tune buckets`: shape buckets for inputs of varying length (few compiles, little padding).

Flags are generated from `BucketOptions`' sections (bucketing/options.py), which state their
names, help and defaults once; read when this command's parser is built.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tpu_tuner.cli.common import add_hf_args, add_out
from tpu_tuner.core.flags import add_section, sections_from

NAME = "buckets"
HELP = "choose shape buckets for inputs of varying length (few compiles, little padding)"
DESCRIPTION = (
    "Measure compile and step costs on this device, then choose the bucket bounds that minimise a planned "
    "run's total time; compare with the usual strategies."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The buckets command's flags: the model's, then every section's."""
    from tpu_tuner.bucketing.options import SECTIONS  # the bucketing package imports torch: only when chosen

    parser.add_argument("model_file", type=Path, help="a workload whose make_batch(batch, seq_len) takes any length")
    add_hf_args(parser)
    for section in SECTIONS.values():
        add_section(parser, section)
    add_out(parser)


def run(args: argparse.Namespace) -> int:
    """Measure, choose and compare buckets; write the run folder and print the table."""
    from tpu_tuner.bucketing.measured import measurement_lines
    from tpu_tuner.bucketing.options import SECTIONS, BucketOptions
    from tpu_tuner.bucketing.study import plan_buckets
    from tpu_tuner.core.run_folder import new_run_dir
    from tpu_tuner.outputs.bucket_report import render_terminal
    from tpu_tuner.outputs.write import write_buckets
    from tpu_tuner.runner.worker_log import WorkerLog

    options = BucketOptions(**sections_from(args, SECTIONS))
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
    print("\n".join(measurement_lines(result)))
    print(f"\nwrote {run_dir}/ ({', '.join(written)})")
    return 0
