"""Fewer intra-op threads against torch's default, interleaved, through the knob's own hooks.

For each workload (and batch size) the baseline and each fewer-thread choice the default space
gives this host are built once (`prepare_step` under `Backend.applied`, as a trial worker does)
and warmed up; then each round times a block of steps of every setting, rotating which runs
first, so drift and other processes' load fall on all of them alike. Prints per setting the
median step, and per fewer-thread setting the geometric mean of its per-round speedup over the
baseline with the rounds' spread (min..max).

Run: python benchmarks/knobs/intra_op_threads.py [--rounds 30] [--steps 20]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch

from tpu_tuner.devices.cpu import CpuBackend
from tpu_tuner.execution.step import prepare_step
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.intra_op_threads import usable_cores
from tpu_tuner.model.workloads.loader import load_workload
from tpu_tuner.tuning.search.search_space import SearchSpace

ROOT = Path(__file__).resolve().parents[2]
# (file, batch size or None for the file's own): small ops first, then larger ones.
WORKLOADS = [
    ("tests/fixtures/tiny_mlp_benchmark.py", None),  # batch 4 x 16 features: tiny ops
    ("examples/mlp.py", 8),  # 3 x 2048-wide layers at batch 8: small matmuls
    ("examples/mlp.py", None),  # the file's batch 256: larger matmuls
    ("tests/fixtures/tiny_gpt.py", None),  # a small transformer's training step: many small ops
]


def measure(path: str, batch_size: int | None, rounds: int, steps: int) -> list[str]:
    backend = CpuBackend()
    workload = load_workload(ROOT / path)
    choices = SearchSpace.load("default", "cpu").grid().get("intra_op_threads", ["all"])
    candidates = [Candidate(intra_op_threads=c) for c in choices]
    built = []
    for candidate in candidates:
        with candidate.process(backend):
            step = prepare_step(workload, backend, candidate, batch_size)
            for _ in range(5):
                step.run()
        built.append(step)
    per_round: list[list[float]] = [[] for _ in candidates]
    for r in range(rounds):
        for offset in range(len(candidates)):
            i = (r + offset) % len(candidates)
            with candidates[i].process(backend):
                times = []
                for _ in range(steps):
                    start = time.perf_counter()
                    built[i].run()
                    times.append(time.perf_counter() - start)
            per_round[i].append(statistics.median(times))
    label = f"{path} batch {batch_size or 'default'} ({'training' if workload.is_training else 'inference'})"
    lines = [label]
    base = per_round[0]
    for candidate, samples in zip(candidates, per_round):
        threads = candidate["intra_op_threads"]
        line = f"  threads {threads:>3}: median step {statistics.median(samples) * 1e3:8.3f} ms"
        if samples is not base:
            ratios = [b / s for b, s in zip(base, samples)]
            geo = math.exp(statistics.fmean(math.log(x) for x in ratios))
            line += f"  speedup over all {geo:.3f}x (rounds {min(ratios):.2f}..{max(ratios):.2f})"
        lines.append(line)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=20, help="steps per setting per round")
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}: {torch.get_num_threads()} intra-op threads by default, "
        f"{usable_cores()} usable cores; load average {__import__('os').getloadavg()[0]:.1f}"
    )
    for path, batch_size in WORKLOADS:
        for line in measure(path, batch_size, args.rounds, args.steps):
            print(line, flush=True)


if __name__ == "__main__":
    main()
