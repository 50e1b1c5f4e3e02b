"""The memory estimate for TorchTPU against the chip's measured peak (issues 54 and 69: within 15%).

On a TPU host (`--measure`), each workload's step is built on the chip for each setting (the
baseline, and the tuned setting the TPU space leads with: `tpu` compile, bf16 parameters, bf16
autocast) and run for a few steps; the peak is `torch.accelerator.max_memory_allocated`
(TorchTPU's allocator, what `Backend.peak_memory_bytes` reads), and the estimate is the one a
trial makes (`estimate_step_memory`: CPU fake tensors, the math attention). Without a chip, the
estimate is made here the same way (the eager step standing for the compiled one, as it does in
a trial) and set against the peaks a v5e chip measured (`tpu_memory_v5e.json`, written by
`--measure`, one row per workload and setting).

The workloads: the README example, a Llama-class model (6 layers, d 2048, batch 2 x 2048) and,
with `--kernelbench DIR` (a checkout of github.com/ScalingIntelligence/KernelBench, not shipped
here), level 3's MiniGPTBlock and ResNet18, the outside models issue 69 measured.

    python benchmarks/chip/tpu_memory_estimate.py [--measure] [--steps 3] [--kernelbench DIR] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
MEASURED = Path(__file__).with_name("tpu_memory_v5e.json")
TARGET = 0.15
LLAMA = (
    "hf:llama?num_hidden_layers=6,hidden_size=2048,intermediate_size=5632,num_attention_heads=16,"
    "num_key_value_heads=4,vocab_size=32000"
)
# name -> (model spec, batch, sequence); None: the file's own. KernelBench's paths are under --kernelbench.
WORKLOADS: dict[str, tuple[str, int | None, int | None]] = {
    "gpt": ("examples/gpt.py", None, None),
    "decoder": ("decoder:vocab=32000,d_model=2048,layers=6,heads=16,kv_heads=4,mlp=5632,max_seq_len=2048", 2, None),
    "llama": (LLAMA, 2, 2048),
    "minigpt-block": ("level3/44_MiniGPTBlock.py", None, None),
    "resnet18": ("level3/9_ResNet18.py", None, None),
}
KERNELBENCH = ("minigpt-block", "resnet18")
# The settings measured: the baseline and the tuned setting the TPU space leads with (its
# precision agent's first seed, with TorchTPU's compile), as candidate dicts.
SETTINGS: dict[str, dict[str, str]] = {
    "baseline": {},
    "tuned": {"execution": "tpu", "autocast": "bfloat16", "param_dtype": "bfloat16"},
}


def _candidate(setting: str, on_chip: bool) -> Any:
    from tpu_tuner.knobs.candidate import Candidate

    values = {**Candidate.baseline("tpu").to_dict(), **SETTINGS[setting]}
    if not on_chip:  # torch.compile(backend="tpu") exists only with torch_tpu; the estimate runs the eager step
        values["execution"] = "eager"
    return Candidate(values)


def _spec(name: str, kernelbench: Path | None) -> str:
    spec = WORKLOADS[name][0]
    if name in KERNELBENCH:
        if kernelbench is None:
            raise SystemExit(f"{name} needs --kernelbench DIR (a checkout of KernelBench's KernelBench/ folder)")
        return str(kernelbench / spec)
    return spec


def estimate(spec: str, batch: int | None, seq: int | None, setting: str) -> tuple[int | None, str | None]:
    """The trial's estimate of `setting` on TorchTPU, made on this host (no chip needed)."""
    from tpu_tuner.devices.cpu import CpuBackend
    from tpu_tuner.devices.torchtpu import TorchTpuBackend
    from tpu_tuner.execution.memory_estimate import estimate_step_memory
    from tpu_tuner.model.workloads.loader import load_workload

    class TorchTpuTables(CpuBackend):
        """This host in everything but what the estimate takes from TorchTPU's backend."""

        kind = "tpu"  # autocast and the knobs key on the chip's device type
        fake_tensor_device = TorchTpuBackend.fake_tensor_device
        estimate_kernels = TorchTpuBackend.estimate_kernels

        def free_heap_bytes(self) -> int | None:
            return None  # the chip's allocator keeps no freed heap

        def memory_in_use_bytes(self) -> int | None:
            return 0

    estimated = estimate_step_memory(load_workload(spec), TorchTpuTables(), _candidate(setting, False), batch, seq)
    return estimated.step_bytes, estimated.reason


def measure(name: str, spec: str, batch: int | None, seq: int | None, setting: str, steps: int) -> dict[str, Any]:
    """On the chip: the step's measured peak under `setting`, and the estimate the trial makes there."""
    import torch

    from tpu_tuner.devices import get_backend
    from tpu_tuner.execution.memory_estimate import estimate_step_memory
    from tpu_tuner.execution.step import prepare_step
    from tpu_tuner.model.workloads.loader import load_workload

    backend, workload = get_backend("tpu"), load_workload(spec)
    candidate = _candidate(setting, True)
    estimated = estimate_step_memory(workload, backend, candidate, batch, seq)
    backend.reset_peak_memory()
    with candidate.process(backend):
        step = prepare_step(workload, backend, candidate, batch, seq)
        for _ in range(steps):
            step.read(step.run())  # each step to its result: nothing left deferred past the peak's read
    peak, method = backend.peak_memory_bytes()
    del step
    return {
        "name": name,
        "setting": setting,
        "workload": spec if name not in KERNELBENCH else WORKLOADS[name][0],
        "batch": batch,
        "seq": seq,
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
    parser.add_argument("--kernelbench", type=Path, help="KernelBench's KernelBench/ folder (level3/...)")
    parser.add_argument("--only", nargs="+", choices=sorted(WORKLOADS), help="these workloads only")
    args = parser.parse_args()
    names = args.only or [n for n in WORKLOADS if n not in KERNELBENCH or args.kernelbench]
    if args.measure:
        rows = []
        for name in names:
            _, batch, seq = WORKLOADS[name]
            for setting in SETTINGS:
                rows.append(measure(name, _spec(name, args.kernelbench), batch, seq, setting, args.steps))
                MEASURED.write_text(json.dumps(rows, indent=2) + "\n")  # kept as each row is measured
    else:
        rows = [r for r in json.loads(MEASURED.read_text()) if r.get("name", _old_name(r)) in names]
        for row in rows:
            name = row.get("name", _old_name(row))
            _, batch, seq = WORKLOADS[name]
            row["estimated_bytes"], row["estimate_reason"] = estimate(
                _spec(name, args.kernelbench), batch, seq, row.get("setting", "baseline")
            )
    print("| workload | setting | measured peak | estimated | error |")
    print("|---|---|---:|---:|---:|")
    worst = 0.0
    for row in rows:
        measured, estimated = row["measured_peak_bytes"], row["estimated_bytes"]
        error = estimated / measured - 1 if measured and estimated else None
        worst = max(worst, abs(error)) if error is not None else worst
        words = f"{error:+.1%}" if error is not None else f"n/a ({row.get('estimate_reason') or 'no peak'})"
        print(
            f"| {row.get('name', _old_name(row))} | {row.get('setting', 'baseline')} | {measured / 2**30:.2f} GiB | "
            f"{(estimated or 0) / 2**30:.2f} GiB | {words} |"
        )
    print(f"worst error {worst:.1%} (target: within {TARGET:.0%})")


def _old_name(row: dict[str, Any]) -> str:
    """The name of a row written before rows were named (the baseline of gpt or the decoder)."""
    return "gpt" if row["workload"] == "examples/gpt.py" else "decoder"


if __name__ == "__main__":
    main()
