"""`tpu-tune` with its default budget on the shipped examples: verified speedups and overhead.

Targets (issue 3): training step of examples/gpt.py at least 1.3x over the default (fp32
highest, eager) within the default tolerance; the inference example (examples/cnn.py) at
least 2x; per-trial overhead outside warm-up and timed steps under 1 s.

    python benchmarks/tuning/tune_examples.py [--examples gpt cnn mlp] [--out results/]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from _runs import describe_run

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", nargs="+", default=["gpt", "cnn"])
    parser.add_argument("--out", type=Path, default=REPO / "results")
    args, extra = parser.parse_known_args()
    for name in args.examples:
        before = set(args.out.glob(f"{name}-tune-*")) if args.out.exists() else set()
        start = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "tpu_tuner.cli",
                "-q",
                str(REPO / "examples" / f"{name}.py"),
                "--out",
                str(args.out),
                *extra,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        wall = time.perf_counter() - start
        (run_dir,) = set(args.out.glob(f"{name}-tune-*")) - before
        print(f"== examples/{name}.py, default budget: {wall:.0f} s wall")
        print(describe_run(run_dir))


if __name__ == "__main__":
    main()
