"""The training-step knobs measured on a model file (default examples/gpt.py): peak memory and
step time per micro-batch count k, and step time per optimizer implementation.

    python benchmarks/knobs/training_step_knobs.py [--model examples/gpt.py] [--batch-size 32] [--steps 5]

Each setting runs in a fresh interpreter (the peak resident set is per process): build the step
as a trial does (`execution/step.py`), one warm-up step, reset the peak mark, then `--steps`
timed steps. Printed per setting: peak resident memory of the timed steps (VmHWM, MiB) and the
median step time. Micro-batching should lower the peak (one slice's activations alive at a time)
at a time cost; the optimizer implementation changes only the optimizer update's time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, sys, time
import torch
from tpu_tuner.devices.cpu import CpuBackend
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.model.workloads.loader import load_workload
from tpu_tuner.execution.step import prepare_step

model, batch, steps, settings = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
backend = CpuBackend()
step = prepare_step(load_workload(model), backend, Candidate(settings), batch_size=batch)
step.run()
backend.reset_peak_memory()
times = []
for _ in range(steps):
    start = time.perf_counter(); step.run(); times.append(time.perf_counter() - start)
peak, _ = backend.peak_memory_bytes()
print(json.dumps({"peak": peak, "times": times}))
"""


def measure(model: str, batch: int, steps: int, settings: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, model, str(batch), str(steps), json.dumps(settings)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="examples/gpt.py")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    print(f"{args.model}, batch {args.batch_size}, {args.steps} timed steps per setting (fresh process each)")
    rows = [{"micro_batches": k} for k in ("1", "2", "4", "8")]
    rows += [{"optimizer_impl": impl} for impl in ("default", "foreach", "fused")]
    for settings in rows:
        result = measure(args.model, args.batch_size, args.steps, settings)
        label = ", ".join(f"{k}={v}" for k, v in settings.items())
        if "error" in result:
            print(f"  {label:<28} failed: {result['error']}")
            continue
        median = statistics.median(result["times"]) * 1e3
        print(f"  {label:<28} peak memory {result['peak'] / 2**20:8.0f} MiB   median step {median:8.1f} ms")


if __name__ == "__main__":
    main()
