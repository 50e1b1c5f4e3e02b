"""The memory estimate for TorchTPU against the chip's measured peak (issue 54, item 7: within 15%).

On a TPU host (`--measure`), each workload's baseline training step is built on the chip and run
for a few steps; the peak is `torch.accelerator.max_memory_allocated` (TorchTPU's allocator, what
`Backend.peak_memory_bytes` reads), and the estimate is the one a trial makes
(`estimate_step_memory`: CPU fake tensors, the math attention). Without a chip, the estimate is
made here the same way and set against the peaks a v5e chip measured on 2026-12-05
(`tpu_memory_v5e.json`, written by `--measure`).

    python benchmarks/tpu_memory_estimate.py [--measure] [--steps 3]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MEASURED = Path(__file__).with_name("tpu_memory_v5e.json")
WORKLOADS = {
    "examples/gpt.py": None,  # its own batch
    "decoder:vocab=32000,d_model=2048,layers=6,heads=16,kv_heads=4,mlp=5632,max_seq_len=2048": 2,  # 2 x 2048
}


def estimate(spec: str, batch: int | None) -> int | None:
    """The trial's estimate of the baseline step on TorchTPU, made on this host (no chip needed)."""
    from tpu_tuner.devices.cpu import CpuBackend
    from tpu_tuner.devices.torchtpu import TorchTpuBackend
    from tpu_tuner.execution.memory_estimate import estimate_step_memory
    from tpu_tuner.knobs.candidate import Candidate
    from tpu_tuner.model.loader import load_workload

    class TorchTpuTables(CpuBackend):
        """This host in everything but what the estimate takes from TorchTPU's backend."""

        fake_tensor_device = TorchTpuBackend.fake_tensor_device
        estimate_kernels = TorchTpuBackend.estimate_kernels

        def free_heap_bytes(self) -> int | None:
            return None  # the chip's allocator keeps no freed heap

        def memory_in_use_bytes(self) -> int | None:
            return 0

    return estimate_step_memory(load_workload(spec), TorchTpuTables(), Candidate(), batch).step_bytes


def measure(spec: str, batch: int | None, steps: int) -> dict[str, Any]:
    """On the chip: the baseline step's measured peak, and the estimate the trial makes there."""
    import torch

    from tpu_tuner.devices import get_backend
    from tpu_tuner.execution.memory_estimate import estimate_step_memory
    from tpu_tuner.execution.step import prepare_step
    from tpu_tuner.knobs.candidate import Candidate
    from tpu_tuner.model.loader import load_workload

    backend, workload = get_backend("tpu"), load_workload(spec)
    candidate = Candidate.baseline("tpu")
    estimated = estimate_step_memory(workload, backend, candidate, batch)
    with candidate.process(backend):
        step = prepare_step(workload, backend, candidate, batch, None)
        backend.reset_peak_memory()
        for _ in range(steps):
            step.run()
        backend.synchronize()
    peak, method = backend.peak_memory_bytes()
    return {
        "workload": spec,
        "batch": batch,
        "measured_peak_bytes": peak,
        "method": method,
        "estimated_bytes": estimated.step_bytes,
        "estimate_reason": estimated.reason,
        "torch": torch.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", action="store_true", help="on a TPU host: measure the peaks, rewrite the json")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    if args.measure:
        rows = [measure(spec, batch, args.steps) for spec, batch in WORKLOADS.items()]
        MEASURED.write_text(json.dumps(rows, indent=2) + "\n")
    else:
        rows = json.loads(MEASURED.read_text())
        for row in rows:
            row["estimated_bytes"] = estimate(row["workload"], row["batch"])
    print("| workload | measured peak | estimated | error |")
    print("|---|---:|---:|---:|")
    for row in rows:
        measured, estimated = row["measured_peak_bytes"], row["estimated_bytes"]
        error = f"{estimated / measured - 1:+.1%}" if measured and estimated else "n/a"
        print(f"| {row['workload'][:40]} | {measured / 1e9:.3f} GB | {(estimated or 0) / 1e9:.3f} GB | {error} |")


if __name__ == "__main__":
    main()
