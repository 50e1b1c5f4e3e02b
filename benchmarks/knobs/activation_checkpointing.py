"""Activation checkpointing on examples/gpt.py training: peak memory against step time (issue 13).

Each setting (none, blocks, every_2nd) runs in a fresh process, the settings interleaved over
`--rounds` rounds, so a process's peak memory (VmHWM, what a CPU trial worker records) is that
setting's own and slow periods of a shared machine fall on every setting alike. Each process
builds the step the trial worker builds (`profiling.step.prepare_step`), counts one step's FLOPs
(forward + backward + the recomputed forwards) and times `--steps` steps after 3 warm-up steps,
its peak memory taken over the timed steps as the trial worker takes it.
About 2 minutes a round on a 2-core CPU.

    python benchmarks/knobs/activation_checkpointing.py [--rounds 3] [--steps 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

VALUES = ("none", "blocks", "every_2nd")
GPT = Path(__file__).resolve().parents[2] / "examples" / "gpt.py"


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS"))
    return int(line.split()[1]) * 1024


def measure(value: str, steps: int) -> dict[str, float | str]:
    """One setting in this process: FLOPs of a step, step times, peak memory."""
    from torch.utils.flop_counter import FlopCounterMode

    from tpu_tuner.devices.cpu import CpuBackend
    from tpu_tuner.execution.step import prepare_step
    from tpu_tuner.knobs.candidate import Candidate
    from tpu_tuner.model.workloads.loader import load_workload

    backend, candidate = CpuBackend(), Candidate(activation_checkpointing=value)
    with candidate.process(backend):
        step = prepare_step(load_workload(GPT), backend, candidate)
        with FlopCounterMode(display=False) as counter:
            step.run()
        for _ in range(2):
            step.run()
        # As the trial worker does (runner/jobs.py): the peak over the timed steps only.
        backend.reset_peak_memory()
        floor = _rss_bytes()
        times = []
        for _ in range(steps):
            started = time.perf_counter()
            step.run()
            times.append(time.perf_counter() - started)
    return {
        "value": value,
        "flops": counter.get_total_flops(),
        "step_median_s": statistics.median(times),
        "step_min_s": min(times),
        "peak_rss_bytes": backend.peak_memory_bytes()[0],
        "rss_floor_bytes": floor,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--one", choices=VALUES, help=argparse.SUPPRESS)  # a child process's setting
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.steps)))
        return
    runs: dict[str, list[dict]] = {value: [] for value in VALUES}
    for round_number in range(args.rounds):
        for value in VALUES:
            done = subprocess.run(
                [sys.executable, __file__, "--one", value, "--steps", str(args.steps)],
                capture_output=True,
                text=True,
                check=True,
            )
            run = json.loads(done.stdout.strip().splitlines()[-1])
            runs[value].append(run)
            print(
                f"round {round_number + 1} {value:9s}: step median {run['step_median_s'] * 1e3:7.0f} ms, "
                f"min {run['step_min_s'] * 1e3:7.0f} ms, peak RSS {run['peak_rss_bytes'] / 2**20:6.0f} MiB",
                flush=True,
            )
    base = runs["none"]
    base_rss = statistics.median(r["peak_rss_bytes"] for r in base)
    base_min = statistics.median(r["step_min_s"] for r in base)
    print(
        f"\n{'setting':10s} {'GFLOP/step':>10s} {'peak RSS MiB':>12s} {'saved MiB':>9s} "
        f"{'step min ms':>11s} {'step median ms':>14s} {'min vs none':>11s}"
    )
    for value, rs in runs.items():
        rss = statistics.median(r["peak_rss_bytes"] for r in rs)
        step_min = statistics.median(r["step_min_s"] for r in rs)
        median = statistics.median(r["step_median_s"] for r in rs)
        print(
            f"{value:10s} {rs[0]['flops'] / 1e9:10.1f} {rss / 2**20:12.0f} {(base_rss - rss) / 2**20:9.0f} "
            f"{step_min * 1e3:11.0f} {median * 1e3:14.0f} {step_min / base_min:10.2f}x"
        )
    print(
        f"(medians over {args.rounds} interleaved rounds; peak RSS over the timed steps, which start from "
        f"about {statistics.median(r['rss_floor_bytes'] for r in base) / 2**20:.0f} MiB: weights, gradients, "
        "optimizer state)"
    )


if __name__ == "__main__":
    main()
