"""TorchTPU's levers, each alone against `tpu` compile + bf16 autocast, interleaved on one chip.

Issue 68, item 3. For one workload (default: the Llama-class `hf:` model at batch 2 x 2048, a
training step), every setting of `SETTINGS` is built, warmed up and timed in turn, round after
round, in one process, the order rotating each round so that no setting always follows another;
each block of the reference and of a lever is a pair of that round. Only one setting's step is
resident at a time (two Llama-class settings in fp32 with AdamW state do not fit a v5e chip side
by side: tuning/verify/interleaved.py), so each is built afresh every round (the compiled programs
come from TorchTPU's in-process cache after the first round). Every sample is a block of steps
run back to back and read to its result (execution/timer.py, the tuner's own timer).

Per lever: the step ratio reference / lever with its 95% interval over the rounds
(metrics/paired.py), the step's MFU on the model FLOPs tpu-tune's profile counts
(profiling/flops_report.py: 6N + 12LHQT for a transformer, full attention) and the chip's bf16
peak, the peak memory, the compile events of its first build. Levers that need a process of their
own (a start-up environment: TorchTPU's eager modes, libtpu flags) are listed, not measured, here.

    python benchmarks/chip/tpu_levers.py --out levers.json                        # on the chip
    python benchmarks/chip/tpu_levers.py --model examples/gpt.py --out gpt.json   # another workload
    python benchmarks/chip/tpu_levers.py --device cpu --model examples/mlp.py --only reference "bf16 parameters"
    python benchmarks/chip/tpu_levers.py --table levers.json                      # the table again, runs nothing
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling, the settings
from tpu_lever_settings import SETTINGS

LLAMA = (
    "hf:llama?num_hidden_layers=6,hidden_size=2048,intermediate_size=5632,num_attention_heads=16,"
    "num_key_value_heads=4,vocab_size=32000"
)


@dataclass
class Record:
    """What one setting measured: a median step per round (seconds), and its first build's figures."""

    samples: list[float] = field(default_factory=list)
    first_call_s: float | None = None
    compiles: dict[str, int] = field(default_factory=dict)
    peak_memory_bytes: int | None = None
    steps_per_sample: int = 1
    failure: str | None = None


def measure(
    name: str, args: argparse.Namespace, workload: Any, backend: Any, base: dict[str, str]
) -> tuple[float, Record]:
    """Build `name`'s step, warm it up and time it; free it. Returns (median step, record of this block)."""
    from tpu_tuner.execution.timer import compile_delta, time_steps

    candidate = candidate_of(name, backend, base)
    backend.fresh_compile_state()
    before = backend.compile_events()
    with candidate.process(backend):
        clock, warm = build(name, args, workload, backend, base)
        backend.reset_peak_memory()
        timing, _ = time_steps(clock, args.steps, 1.0, 400)
        peak, _ = backend.peak_memory_bytes()
    record = Record(
        first_call_s=warm.first_call_seconds,
        compiles=compile_delta(before, backend.compile_events()),
        peak_memory_bytes=peak,
        steps_per_sample=clock.block,
    )
    del clock
    gc.collect()
    backend.release_cached_memory()  # as the tuner's worker does before each trial
    return timing.median, record


def reference_base(backend: Any, over: dict[str, str]) -> dict[str, str]:
    """The reference's knob values (`tpu` compile, or the device's compile backend, + bf16
    autocast), with `over` (--base) on top: what every setting but the baseline changes."""
    from tpu_tuner.knobs.candidate import Candidate

    defaults = Candidate.baseline(backend.kind).to_dict()
    return {**defaults, "execution": backend.default_compile_backend(), "autocast": "bfloat16", **over}


def candidate_of(name: str, backend: Any, base: dict[str, str]) -> Any:
    """The knob values of setting `name` (over the reference's `base`, or the device's defaults)."""
    from tpu_tuner.knobs.candidate import Candidate

    setting = SETTINGS[name]
    return Candidate.baseline(backend.kind) if setting.baseline else Candidate({**base, **setting.knobs})


def build(name: str, args: argparse.Namespace, workload: Any, backend: Any, base: dict[str, str]) -> tuple[Any, Any]:
    """Setting `name`'s step built and warmed up (inside its candidate's `process`): its clock and warm-up."""
    from tpu_tuner.execution.step import prepare_step
    from tpu_tuner.execution.timer import StepClock, warm_up

    candidate = candidate_of(name, backend, base)
    step = prepare_step(workload, backend, candidate, args.batch_size, args.seq)
    if SETTINGS[name].patch is not None:
        SETTINGS[name].patch(step, backend, workload, candidate)  # type: ignore[misc]
    clock = StepClock.of(step, backend)
    return clock, warm_up(clock, 2, 20)


def resident_together(
    names: list[str], args: argparse.Namespace, workload: Any, backend: Any, base: dict[str, str]
) -> dict[str, float]:
    """The settings `names` built side by side in this process (as a window of one process keeps
    them), then timed alternately for `args.rounds` rounds: each one's median step, seconds."""
    import contextlib

    backend.fresh_compile_state()
    clocks = {}
    for name in names:
        with candidate_of(name, backend, base).process(backend):
            clocks[name] = build(name, args, workload, backend, base)[0]
    medians: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.rounds):
        for name in names:
            with contextlib.ExitStack() as stack:
                stack.enter_context(candidate_of(name, backend, base).process(backend))
                medians[name].append(statistics.median(clocks[name].sample() for _ in range(5)))
    del clocks
    gc.collect()
    return {name: statistics.median(values) for name, values in medians.items()}


def model_flops(args: argparse.Namespace, workload: Any, backend: Any, base: dict[str, str]) -> float:
    """The step's model FLOPs as tpu-tune's profile counts them (one eager step under the counters)."""
    from tpu_tuner.execution.step import prepare_step
    from tpu_tuner.knobs.candidate import Candidate
    from tpu_tuner.metrics.flops import count_step
    from tpu_tuner.profiling.flops_report import flops_report

    # Counted with the device's own attention: a kernel (splash) is opaque to the counters, and
    # splash run eagerly under them with blocks recomputed failed the recompute's check on a v5e.
    defaults = Candidate.baseline(backend.kind)
    candidate = Candidate(
        {**base, "execution": defaults["execution"], "attention_kernel": defaults["attention_kernel"]}
    )
    with candidate.process(backend):
        step = prepare_step(workload, backend, candidate, args.batch_size, args.seq)
        counted = count_step(step.run_eager)
        report = flops_report(workload, step.model, counted, args.batch_size, args.seq, "full")
    del step
    gc.collect()
    backend.release_cached_memory()  # the eager step's cache, before the first compiled setting
    return float(report.model_per_step)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tpu_tuner.core.version import __version__
    from tpu_tuner.devices import get_backend
    from tpu_tuner.model.workloads.loader import load_workload

    backend = get_backend(args.device)
    workload = load_workload(args.model)
    base = reference_base(backend, args.base)
    names = args.only or list(SETTINGS)
    names = ["reference"] + [n for n in names if n != "reference"]
    apart = {n: env for n in names if (env := candidate_of(n, backend, base).environment(backend))}
    names = [n for n in names if n not in apart]
    info = backend.info()
    peak = max(info.peak.flops_per_s.values(), default=0.0)
    flops = model_flops(args, workload, backend, base)
    records = {name: Record() for name in names}
    started = time.perf_counter()

    def result(together: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "model": args.model,
            "batch_size": args.batch_size,
            "seq": args.seq,
            "device": info.name,
            "versions": {"tpu_tune": __version__, **_versions()},
            "model_flops_per_step": flops,
            "peak_flops_per_s": peak,
            "rounds": args.rounds,
            "base": dict(args.base),  # knob values over the reference's, for every setting (--base)
            "wall_s": round(time.perf_counter() - started, 1),
            "settings": {name: {**vars(records[name]), "about": SETTINGS[name].about} for name in names},
            "needs_own_process": dict(apart),
            "resident_together": together or {},
        }

    for round_index in range(args.rounds):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for name in order:
            record = records[name]
            if record.failure is not None:
                continue
            try:
                median, block = measure(name, args, workload, backend, base)
            except Exception as exc:  # a lever that fails is a row of the table, not the end of the run
                from tpu_tuner.core.failures import failure_line

                record.failure = failure_line(exc)
                traceback.print_exc()  # the whole chain in the call's output: the JSON keeps one line
                gc.collect()
                continue
            record.samples.append(median)
            if record.first_call_s is None:
                record.first_call_s, record.compiles = block.first_call_s, block.compiles
            record.peak_memory_bytes = max(record.peak_memory_bytes or 0, block.peak_memory_bytes or 0) or None
            record.steps_per_sample = block.steps_per_sample
            print(f"round {round_index + 1}: {name}: {median * 1e3:.1f} ms", flush=True)
            # What is measured so far survives a run cut short (the chip's first run lost a round).
            args.out.write_text(json.dumps(result(), indent=1))
    together: dict[str, Any] = {}
    if args.resident and {"baseline", "reference"} <= set(names):
        try:
            together = resident_together(["baseline", "reference"], args, workload, backend, base)
        except Exception as exc:
            together = {"failure": f"{type(exc).__name__}: {str(exc).strip()[:300]}"}
        print(f"resident together: {together}", flush=True)
    return result(together)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("torch", "torch-tpu", "libtpu", "transformers"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            pass
    return found


def _shape(result: dict[str, Any]) -> str:
    """The batch the levers ran at, as the table's title says it."""
    if result["batch_size"] is None and result["seq"] is None:
        return "the model's own batch"
    return f"batch {result['batch_size']} x {result['seq']}"


def table(result: dict[str, Any]) -> str:
    """The markdown table: each lever's step against the reference's, paired by round."""
    from tpu_tuner.metrics.paired import paired_speedup

    settings = result["settings"]
    reference = settings["reference"]["samples"]
    flops, peak = result["model_flops_per_step"], result["peak_flops_per_s"]
    lines = [
        f"{result['model']} ({_shape(result)}) on {result['device']}, "
        f"{result['rounds']} rounds; versions {result['versions']}"
        + (f"; every setting over {result['base']}" if result.get("base") else ""),
        "",
        "| setting | step (median of rounds) | MFU | reference / setting (95% CI) | peak memory | first call |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, row in settings.items():
        samples = row["samples"]
        if row.get("failure") or not samples:
            lines.append(f"| {name} | failed: {row.get('failure')} | | | | |")
            continue
        step = statistics.median(samples)
        mfu = f"{flops / step / peak:.1%}" if peak and flops else "-"
        ratio = "1 (itself)"
        paired = min(len(samples), len(reference))
        if name != "reference" and paired >= 2:
            s = paired_speedup(reference[:paired], samples[:paired])
            ratio = f"{s.speedup:.3f}x ({s.ci_low:.3f}-{s.ci_high:.3f})"
        elif name != "reference":
            ratio = f"{statistics.median(reference) / step:.3f}x (one round)" if reference else "-"
        memory = f"{row['peak_memory_bytes'] / 2**30:.2f} GiB" if row.get("peak_memory_bytes") else "-"
        first = f"{row['first_call_s']:.1f} s" if row.get("first_call_s") is not None else "-"
        lines.append(f"| {name} | {step * 1e3:.1f} ms | {mfu} | {ratio} | {memory} | {first} |")
    for name, env in result.get("needs_own_process", {}).items():
        lines.append(f"| {name} | not measured here: needs a process of its own ({', '.join(env)}) | | | | |")
    together = result.get("resident_together") or {}
    if together:
        alone = ", ".join(
            f"{name} {statistics.median(settings[name]['samples']) * 1e3:.1f} ms alone, {together[name] * 1e3:.1f} ms"
            for name in together
            if name in settings and settings[name]["samples"] and isinstance(together[name], float)
        )
        lines += ["", f"Built side by side in one process: {alone or together}"]
    return "\n".join(lines)


def base_settings(pairs: list[str]) -> dict[str, str]:
    """``KNOB=VALUE`` words as knob values, each checked by its knob (ValueError names a bad one)."""
    from tpu_tuner.knobs.candidate import Candidate

    settings = {}
    for pair in pairs:
        name, equals, value = pair.partition("=")
        if not equals or not value:
            raise ValueError(f"{pair!r} is not KNOB=VALUE")
        settings[name] = value
    Candidate(settings)  # raises ValueError naming an unknown knob or a bad value
    return settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=LLAMA)
    parser.add_argument("--batch-size", type=int, help="default: 2 for the Llama-class model, else the model's own")
    parser.add_argument("--seq", type=int, help="default: 2048 for the Llama-class model, else the model's own")
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="steps timed per block at the least")
    parser.add_argument("--only", nargs="+", choices=list(SETTINGS), help="these settings (the reference always)")
    parser.add_argument("--out", type=Path, default=Path("levers.json"))
    parser.add_argument(
        "--resident",
        action="store_true",
        help="then the baseline and the reference built side by side, timed alternately",
    )
    parser.add_argument(
        "--base",
        nargs="+",
        default=[],
        metavar="KNOB=VALUE",
        help="knob values over the reference's, for every setting (a step that fits only with them: "
        "param_dtype=bfloat16 activation_checkpointing=every_2nd)",
    )
    parser.add_argument("--table", type=Path, help="print the table of a finished run's JSON, run nothing")
    args = parser.parse_args(argv)
    if args.table is not None:
        print(table(json.loads(args.table.read_text())))
        return 0
    if args.model == LLAMA:
        args.batch_size, args.seq = args.batch_size or 2, args.seq or 2048
    if args.rounds < 1 or min(args.batch_size or 1, args.seq or 1) < 1:
        print("tpu_levers: --rounds, --batch-size and --seq must be positive", file=sys.stderr)
        return 2
    try:
        args.base = base_settings(args.base)
    except ValueError as exc:
        print(f"tpu_levers: --base: {exc}", file=sys.stderr)
        return 2
    result = run(args)
    args.out.write_text(
        json.dumps(result, indent=1, default=lambda v: v if not isinstance(v, float) or math.isfinite(v) else None)
    )
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
