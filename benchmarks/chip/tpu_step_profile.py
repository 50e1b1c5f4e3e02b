"""Where a setting's step goes on the device: tpu_levers.py's settings built, timed and profiled.

Issue 68, item 4: the 335M decoder's best TorchTPU step (splash, every block recomputed, bf16
parameters) ran 491 ms where the JAX program of the same shape runs 364 ms on the same chip. For
each setting named (over --base, as tpu_levers.py builds it), this script times the step with the
tuner's timer, then runs a few steps under torch.profiler with the device's activities (TorchTPU's
device tracer is the PrivateUse1 activity; with $TPU_TUNE_XPROF_DIR set it also writes the XPlane
trace XProf reads) and reports the step's wall time beside the device's busy time (the union of
the trace's device events: what is not busy is host time the device waits through), the
operators that take the most device time (host time on a CPU), and the host's ranges by
inclusive time (what the host does meanwhile).

    python benchmarks/chip/tpu_step_profile.py --model "hf:llama?num_hidden_layers=16,..." --batch-size 8 \\
        --seq 2048 --base param_dtype=bfloat16 activation_checkpointing=blocks --settings reference splash
    python benchmarks/chip/tpu_step_profile.py --device cpu --model examples/mlp.py --base execution=eager
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its siblings: the levers and their settings
import tpu_levers
from tpu_lever_settings import SETTINGS


def profile_setting(name: str, args: argparse.Namespace, workload: Any, backend: Any, base: dict[str, str]) -> dict:
    """Setting `name` built, timed (median step) and profiled over `args.profile_steps` steps."""
    from tpu_tuner.execution.operators import device_busy, top_operators
    from tpu_tuner.execution.timer import time_steps

    backend.fresh_compile_state()
    with tpu_levers.candidate_of(name, backend, base).process(backend):
        clock, _ = tpu_levers.build(name, args, workload, backend, base)
        timing, _ = time_steps(clock, args.steps, 1.0, 200)
        events: list[Any] = []
        shares: dict[str, float] = {}
        one_step = functools.partial(clock.seconds, 1)  # a step read to its result, as timed
        operators = top_operators(one_step, backend, args.profile_steps, args.top, events_out=events, shares_out=shares)
        busy = device_busy(events, args.profile_steps)
        allocator = {"step_built": allocator_bytes()}
        del clock, one_step
        gc.collect()
        allocator["step_freed"] = allocator_bytes()
        backend.release_cached_memory()
        allocator["released"] = allocator_bytes()
    return {
        # Whether TorchTPU's allocator keeps freed memory cached (reserved above allocated once the
        # step is freed) and what the worker's release before each trial hands back.
        "allocator_bytes": allocator,
        "step_s": timing.median,
        "device_busy_s": busy.seconds_per_step if busy else None,
        "device_busy_method": busy.method if busy else "no device events in the trace (host time only)",
        "optimizer_share": shares.get("optimizer_step"),
        "operators": [dataclasses.asdict(op) for op in operators],
        # What the host does while the device waits (the seventh session's 163 ms a step): its
        # ranges by inclusive time, read from the same trace, so no XPlane file need come back.
        "host_ranges": host_ranges(events, args.profile_steps, args.top),
    }


def host_ranges(events: list[Any], steps: int, top: int) -> list[dict[str, Any]]:
    """The host's profiler ranges and operators (CPU events) by inclusive time a step, with their
    own (self) time: the optimizer's range, the compiled regions, the reads, the autograd engine."""
    from torch.autograd import DeviceType

    found: dict[str, list[float]] = {}
    for event in events:
        if getattr(event, "device_type", DeviceType.CPU) != DeviceType.CPU:
            continue
        calls, inclusive, own = found.setdefault(event.name, [0.0, 0.0, 0.0])
        found[event.name] = [calls + 1, inclusive + event.cpu_time_total, own + event.self_cpu_time_total]
    rows = sorted(found.items(), key=lambda item: -item[1][1])[:top]
    return [
        {
            "name": name,
            "calls_per_step": calls / steps,
            "inclusive_ms_per_step": inclusive / steps / 1e3,
            "self_ms_per_step": own / steps / 1e3,
        }
        for name, (calls, inclusive, own) in rows
    ]


def allocator_bytes() -> dict[str, int | None]:
    """torch's device-generic allocator figures (None where the device's allocator has none)."""
    import torch

    found: dict[str, int | None] = {}
    for name in ("memory_allocated", "memory_reserved"):
        try:
            found[name] = int(getattr(torch.accelerator, name)())
        except Exception:  # a device without them: said as None, the profile goes on
            found[name] = None
    return found


def _allocator_words(stages: dict[str, dict[str, int | None]]) -> str:
    def gib(value: int | None) -> str:
        return "-" if value is None else f"{value / 2**30:.2f}"

    return ", ".join(
        f"{stage.replace('_', ' ')} {gib(found['memory_allocated'])} / {gib(found['memory_reserved'])}"
        for stage, found in stages.items()
    )


def table(result: dict[str, Any]) -> str:
    """Each setting's wall step beside the device's busy time, then its top operators."""
    lines = [f"{result['model']} ({result['device']}); every setting over {result['base']}"]
    for name, found in result["settings"].items():
        if "failure" in found:
            lines += ["", f"{name}: failed: {found['failure']}"]
            continue
        step, busy = found["step_s"], found["device_busy_s"]
        said = f"device busy {busy * 1e3:.1f} ms ({busy / step:.0%} of the step)" if busy else "no device events"
        lines += ["", f"{name}: step {step * 1e3:.1f} ms, {said}"]
        if found.get("allocator_bytes"):
            lines.append("allocator, allocated / reserved GiB: " + _allocator_words(found["allocator_bytes"]))
        lines += _table(
            "| operator | calls a step | ms a step | share |",
            found["operators"],
            lambda op: f"{op['self_ms_per_step']:.2f} | {op['share']:.1%}",
        )
        if found.get("host_ranges"):
            lines += _table(
                "| host range (CPU) | calls a step | inclusive ms a step | self ms a step |",
                found["host_ranges"],
                lambda host: f"{host['inclusive_ms_per_step']:.2f} | {host['self_ms_per_step']:.2f}",
            )
    return "\n".join(lines)


def _table(header: str, rows: list[dict], figures: Callable[[dict], str]) -> list[str]:
    """A markdown table after a blank line: each row's name (pipes made slashes), its calls a step,
    then `figures` of it."""
    lines = ["", header, "|---|---:|---:|---:|"]
    for row in rows:
        name = row["name"][:90].replace("|", "/")
        lines.append(f"| {name} | {row['calls_per_step']:.1f} | {figures(row)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=tpu_levers.LLAMA)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--seq", type=int)
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=["reference"])
    parser.add_argument("--base", nargs="+", default=[], metavar="KNOB=VALUE", help="as tpu_levers.py's --base")
    parser.add_argument("--steps", type=int, default=10, help="steps timed at the least")
    parser.add_argument("--profile-steps", type=int, default=3, help="steps profiled (after the timed ones)")
    parser.add_argument("--top", type=int, default=25, help="operators listed")
    parser.add_argument("--out", type=Path, default=Path("step_profile.json"))
    args = parser.parse_args(argv)
    if min(args.steps, args.profile_steps, args.top, args.batch_size or 1, args.seq or 1) < 1:
        print(
            "tpu_step_profile: --steps, --profile-steps, --top, --batch-size and --seq must be positive",
            file=sys.stderr,
        )
        return 2
    try:
        over = tpu_levers.base_settings(args.base)
    except ValueError as exc:
        print(f"tpu_step_profile: --base: {exc}", file=sys.stderr)
        return 2
    from tpu_tuner.devices import get_backend
    from tpu_tuner.model.workloads.loader import load_workload

    backend = get_backend(args.device)
    workload = load_workload(args.model)
    base = tpu_levers.reference_base(backend, over)
    result: dict[str, Any] = {"model": args.model, "device": backend.info().name, "base": over, "settings": {}}
    for name in args.settings:
        try:
            result["settings"][name] = profile_setting(name, args, workload, backend, base)
        except Exception as exc:  # one setting failing (out of memory) is a line, not the end
            from tpu_tuner.core.failures import failure_line

            result["settings"][name] = {"failure": failure_line(exc)}
        args.out.write_text(json.dumps(result, indent=1))  # what is measured survives a cut-short call
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
