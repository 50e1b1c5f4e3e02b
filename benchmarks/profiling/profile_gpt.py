"""Wall time of the whole `tpu-tune profile examples/gpt.py` command, with a warm roofline cache.

Target (issue 2): under 30 s on the 2-core CI machine. Runs the command `--runs` times (after
one run that warms the roofline cache if it is cold) and prints each wall time and the median,
plus the step time and MFU each profile measured.

    python benchmarks/profiling/profile_gpt.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_profile(out: Path) -> tuple[float, dict]:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "tpu_tuner.cli", "-q", "profile", str(REPO / "examples" / "gpt.py"), "--out", str(out)],
        check=True,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - start
    newest = max(out.iterdir(), key=lambda p: p.stat().st_mtime)
    return wall, json.loads((newest / "profile.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        warm_wall, warm = run_profile(out)
        cached = warm["device"]["peak"]["source"].endswith("(cached)")
        print(f"first run: {warm_wall:.1f} s ({'roofline cache was warm' if cached else 'measured the roofline'})")
        walls = []
        for index in range(args.runs):
            wall, data = run_profile(out)
            walls.append(wall)
            print(
                f"run {index + 1}: wall {wall:.1f} s; step median {data['timing']['median'] * 1e3:.0f} ms "
                f"(p10 {data['timing']['p10'] * 1e3:.0f}, p90 {data['timing']['p90'] * 1e3:.0f}, "
                f"{len(data['timing']['samples'])} steps); MFU {data['mfu']:.1%} of "
                f"{data['peak_flops_per_s'] / 1e9:.0f} GFLOP/s {data['peak_dtype']}"
            )
        print(
            f"median wall time of the whole command, warm cache: {statistics.median(walls):.1f} s "
            f"over {len(walls)} runs (target < 30 s)"
        )


if __name__ == "__main__":
    main()
