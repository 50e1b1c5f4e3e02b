"""The planner's prediction for one TPU chip, against the very program it planned run on that chip.

The planner never runs what it plans: it compiles for a TPU topology on a CPU-only host and
predicts from the compiler's figures (docs/planner.md). This check closes the loop where a chip is
at hand, in three steps:

1. ``export`` (here, no TPU): `tpu-tune plan`'s own path plans a decoder shape on a one-chip
   topology, then compiles the plan's best point once more with its training step serialized by
   ``jax.export`` (program.compile_step's ``export_to``), and writes the prediction beside it.
2. ``run`` (on the machine with the chip; needs JAX and nothing of this project, so no torch):
   deserializes the step, feeds it random weights, zero optimizer state and random tokens, times
   steady steps and reads the chip's peak HBM and its own compiler's memory analysis.
3. ``compare`` (here): predicted against measured, as a table.

    python benchmarks/chip/tpu_chip_check.py export [--out results/tpu_check] [--topology v5e-1]
    python benchmarks/chip/tpu_chip_check.py run [--out results/tpu_check] [--steps 20]
    python benchmarks/chip/tpu_chip_check.py compare [--out results/tpu_check]
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
log = logging.getLogger(__name__)
# Llama-shaped (heads 128 wide), ~335M parameters: AdamW state and activations fit one v5e chip (16 GiB).
SHAPE = "decoder:vocab=32000,d_model=1024,layers=16,heads=8,mlp=4096,max_seq_len=2048"
STEP_FILE = "step.jaxexport"
PREDICTED_FILE = "predicted.json"
MEASURED_FILE = "measured.json"


def export(
    out: Path, shape: str, topology: str, global_batch: int, seq_len: int, remat: str, flash_block: int | None
) -> None:
    """Plan `shape` on the one-chip `topology` with the policy `remat` (in `flash_block` blocks;
    None: the planner's choice): its one point compiled as `tpu-tune plan` compiles it, its step
    serialized by `jax.export` from that very compile, its prediction written beside it."""
    # The project (and torch) only here: `run` must work where neither is installed.
    from dataclasses import fields, replace

    from tpu_tuner.model.meshes.layouts import Layout
    from tpu_tuner.planner.compiler.compile_pool import CompilePool
    from tpu_tuner.planner.plans.evaluate import evaluate
    from tpu_tuner.planner.plans.plan_options import PlanOptions, PlanStep, PlanTarget
    from tpu_tuner.planner.plans.plan_problem import PlanProblem, build_problem
    from tpu_tuner.planner.plans.plan_result import result_of
    from tpu_tuner.planner.plans.plan_space import PlanPoint
    from tpu_tuner.planner.topology import parse_topology

    step = PlanStep(global_batch=global_batch, seq_len=seq_len, remat=remat, flash_block=flash_block)
    options = PlanOptions(PlanTarget(topology), step=step)
    slice_ = parse_topology(topology)
    if slice_.devices != 1:
        raise SystemExit(f"the chip check plans one chip, not {topology}")
    out.mkdir(parents=True, exist_ok=True)
    exported_to = str(out / STEP_FILE)

    class Exporting(PlanProblem):
        """The plan's problem whose whole-step compile also serializes the step."""

        def job(self, point: PlanPoint, blocks: int, fast: bool | None = None) -> Any:
            job = super().job(point, blocks, fast)
            return replace(job, export_to=exported_to) if blocks == self.dims.scanned and not job.fast else job

    problem = build_problem(shape, options, slice_, print)
    problem = Exporting(**{f.name: getattr(problem, f.name) for f in fields(problem)})
    point = PlanPoint(Layout(1, 1, 1), remat, 1)  # one chip: its only layout
    with CompilePool(1) as pool:
        best = result_of(problem, list(evaluate(problem, [point], pool, print).values()), [], remat, 0.0).plans[0]
    if best.prediction is None or not best.fits:
        print(f"{remat}: does not fit {topology}: {best.why}")
        return
    prediction = best.prediction
    record = {
        "shape": shape,
        "topology": topology,
        "global_batch": global_batch,
        "seq_len": seq_len,
        "layout": str(best.layout),
        "remat": best.remat,
        "flash_block": problem.flash_block_of(best.point),
        "accumulation": best.accumulation,
        "vocab": problem.dims.shape.vocab,
        "model_flops_per_step": problem.model_flops,
        "compiled_flops": best.compiled.flops,
        "compiled_bytes": best.compiled.bytes_accessed,
        "predicted_attention_kernel_s": prediction.attention_kernel_seconds,
        "predicted_step_s": prediction.step_seconds,
        "predicted_compute_s": prediction.compute_seconds,
        "predicted_memory_s": prediction.memory_seconds,
        "predicted_mfu": prediction.mfu,
        "predicted_tokens_per_s": prediction.tokens_per_second,
        "band_points": best.band.points if best.band else None,
        "planned_peak_bytes": best.compiled.peak_bytes,
        "planned_allocated_bytes": best.compiled.allocated_bytes,
        "peak_tflops_per_device": slice_.peak_flops_per_device / 1e12,
    }
    (out / PREDICTED_FILE).write_text(json.dumps(record, indent=1))
    print(json.dumps(record, indent=1))


def run(out: Path, steps: int) -> None:
    """Run the step exported into `out` on this machine's first device and write what it measured."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from tpu_attention_kernel import libtpu_version  # beside this file: run needs no project installed

    predicted = json.loads((out / PREDICTED_FILE).read_text())
    exported = jax.export.deserialize(bytearray((out / STEP_FILE).read_bytes()))
    (params_avals, state_avals, buffer_avals, token_aval, _), _ = jax.tree.unflatten(
        exported.in_tree, exported.in_avals
    )
    rng = np.random.default_rng(0)

    def weights(aval: Any) -> Any:  # small normal weights, as an initialiser gives
        return jnp.asarray(rng.normal(0, 0.02, aval.shape), aval.dtype)

    params = jax.tree.map(weights, params_avals)
    state = jax.tree.map(lambda aval: jnp.zeros(aval.shape, aval.dtype), state_avals)  # AdamW's moments start at 0
    buffers = jax.tree.map(weights, buffer_avals)
    tokens = jnp.asarray(rng.integers(0, predicted["vocab"], token_aval.shape), token_aval.dtype)
    step = jax.jit(exported.call, donate_argnums=(0, 1))
    start = time.perf_counter()
    compiled = step.lower(params, state, buffers, tokens, tokens).compile()
    compile_s = time.perf_counter() - start
    memory = compiled.memory_analysis()
    seconds, losses = [], []
    for _ in range(steps):
        start = time.perf_counter()
        params, state, loss = compiled(params, state, buffers, tokens, tokens)
        losses.append(float(loss))  # waits for the step
        seconds.append(time.perf_counter() - start)
    steady = seconds[3:]  # the first steps pay the program's load and first transfers
    traced = 3
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
            for _ in range(traced):
                params, state, loss = compiled(params, state, buffers, tokens, tokens)
                float(loss)
        top_ops = _device_op_times(trace_dir, traced)
    stats = jax.devices()[0].memory_stats() or {}
    record = {
        "device": str(jax.devices()[0].device_kind),
        "jax": jax.__version__,
        "libtpu": libtpu_version(),
        "date": time.strftime("%Y-%m-%d"),
        "compile_s": compile_s,
        "step_s_median": statistics.median(steady),
        "step_s_min": min(steady),
        "step_s_max": max(steady),
        "steps": len(steady),
        "loss_first_last": [losses[0], losses[-1]],
        "peak_bytes_in_use": stats.get("peak_bytes_in_use"),
        "bytes_limit": stats.get("bytes_limit"),
        "chip_compiler_temp_bytes": memory.temp_size_in_bytes if memory else None,
        "chip_compiler_argument_bytes": memory.argument_size_in_bytes if memory else None,
        "chip_compiler_peak_bytes": getattr(memory, "peak_memory_in_bytes", None) if memory else None,
        "matmul_tflops": _matmul_tflops(jax, jnp),
        "top_ops_ms_per_step": top_ops,
    }
    (out / MEASURED_FILE).write_text(json.dumps(record, indent=1))
    print(json.dumps(record, indent=1))


def _device_op_times(trace_dir: str, steps: int) -> list[tuple[str, float]]:
    """The chip's 15 longest XLA ops a step (name, ms), read from the profiler's trace of `steps`
    steps with JAX's own reader (no XProf needed). A loop's op holds its body's, which are listed too.
    libtpu 0.0.42's trace carries no op category, so none is given."""
    from jax.profiler import ProfileData

    planes = [
        plane for path in Path(trace_dir).rglob("*.xplane.pb") for plane in ProfileData.from_file(str(path)).planes
    ]
    by_op: collections.Counter[str] = collections.Counter()
    for plane in planes:
        if plane.name.startswith("/device:TPU:0"):
            for line in plane.lines:
                if line.name == "XLA Ops":
                    for event in line.events:
                        by_op[event.name] += event.duration_ns / 1e6 / steps
    # The Pallas kernels (a dense decoder's only ones are flash attention's), summed over every
    # call: what a step's attention costs, to set beside the kernel's isolated timings.
    kernels = sum(ms for name, ms in by_op.items() if "custom-call" in name or "custom_call" in name)
    by_op["(sum of every Pallas custom call)"] = kernels
    if not by_op:  # another libtpu may name its planes otherwise: say what there was
        return [
            (f"no XLA Ops line; plane {plane.name}: {[line.name for line in plane.lines]}", 0.0) for plane in planes
        ]
    return by_op.most_common(25)


def _matmul_tflops(jax: Any, jnp: Any, n: int = 8192, repeats: int = 10) -> float:
    """What this chip's bf16 matrix unit gives on a large square product (the MFU's ceiling)."""
    a = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
    product = jax.jit(lambda x: x @ x)
    product(a).block_until_ready()
    start = time.perf_counter()
    for _ in range(repeats):
        result = product(a)
    result.block_until_ready()
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12


def compare(out: Path) -> None:
    """Print the prediction against the measurement of the step exported into `out`."""
    predicted = json.loads((out / PREDICTED_FILE).read_text())
    measured = json.loads((out / MEASURED_FILE).read_text())
    gib = 2**30
    step = measured["step_s_median"]
    mfu = predicted["model_flops_per_step"] / step / (predicted["peak_tflops_per_device"] * 1e12)
    rows = [
        ("step (s)", f"{predicted['predicted_step_s']:.4f}", f"{step:.4f} (min {measured['step_s_min']:.4f})"),
        ("MFU", f"{predicted['predicted_mfu']:.1%} +- {predicted['band_points']:.1f} points", f"{mfu:.1%}"),
        (
            "peak HBM (GiB)",
            f"{predicted['planned_peak_bytes'] / gib:.2f}",
            f"{(measured['peak_bytes_in_use'] or 0) / gib:.2f} in the allocator's buffers at the peak "
            "(no temporaries); the chip's compiler "
            f"{(measured['chip_compiler_peak_bytes'] or 0) / gib:.2f}",
        ),
    ]
    print(
        f"{predicted['shape']} on {predicted['topology']} ({measured['device']}), batch "
        f"{predicted['global_batch']} x {predicted['seq_len']}, {predicted['layout']}, remat {predicted['remat']}"
    )
    for name, planned, seen in rows:
        print(f"{name:16} predicted {planned:40} measured {seen}")
    peak = predicted["peak_tflops_per_device"]
    print(f"bf16 matmul on the chip: {measured['matmul_tflops']:.0f} TFLOP/s (peak {peak:.0f})")


def repredicted(predicted: dict[str, Any], chip: tuple[float, float] | None = None) -> tuple[float, float]:
    """(step seconds, attention kernel seconds) the planner predicts now for an exported one-chip
    program, from its kept compiler figures: the prediction re-made with the current cost model;
    `chip` (efficiency, recompute weight) in place of the kept chip step constants (`fit`)."""
    from tpu_tuner.planner.plans.evaluate import predicted as prediction_of
    from tpu_tuner.planner.prediction.attention_kernel import ChipStep

    problem, point, compiled = _planned(predicted)
    candidate = None
    if chip is not None:
        candidate = ChipStep(chip[0], chip[1], 1, "a candidate of fit", problem.recomputed_flops(point))
    prediction = prediction_of(problem, point, compiled, candidate)
    return prediction.step_seconds, prediction.attention_kernel_seconds


@functools.cache
def _problem(shape: str, topology: str, global_batch: int, seq_len: int) -> Any:
    from tpu_tuner.planner.plans.plan_options import PlanOptions, PlanStep, PlanTarget
    from tpu_tuner.planner.plans.plan_problem import build_problem
    from tpu_tuner.planner.topology import parse_topology

    slice_ = parse_topology(topology)
    if slice_.devices != 1:
        raise SystemExit(f"the chip check plans one chip, not {topology}")
    step = PlanStep(global_batch=global_batch, seq_len=seq_len)
    return build_problem(shape, PlanOptions(PlanTarget(topology), step=step), slice_, log.info)


def _planned(predicted: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(problem, point, compiled step) of a kept one-chip prediction record."""
    from tpu_tuner.model.meshes.layouts import Layout
    from tpu_tuner.planner.compiler.compiled_step import CompiledStep
    from tpu_tuner.planner.plans.plan_space import PlanPoint

    problem = _problem(predicted["shape"], predicted["topology"], predicted["global_batch"], predicted["seq_len"])
    point = PlanPoint(Layout(1, 1, 1), predicted["remat"], predicted["accumulation"], predicted["flash_block"] or 128)
    # Records from before 2026-12-06 kept the memory time, not the bytes: the bytes are that time's.
    bandwidth = problem.topology.hbm_bytes_per_s_per_device
    bytes_accessed = predicted.get("compiled_bytes") or predicted["predicted_memory_s"] * bandwidth
    return problem, point, CompiledStep(predicted["compiled_flops"], bytes_accessed, 0.0, 0.0, 0.0, 0.0)


def _measured_runs(out: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Every (prediction record, measurement) kept under the folder `out`, or in the file `out`
    (the kept runs: benchmarks/chip/tpu_chip_check_steps_v5e.json, tpu_chip_check_v5e.json)."""
    if out.is_file():
        return [(run["predicted"], run["measured"]) for run in json.loads(out.read_text())["runs"]]
    return [
        (json.loads((f.parent / PREDICTED_FILE).read_text()), json.loads(f.read_text()))
        for f in sorted(out.rglob(MEASURED_FILE))
    ]


def fit(out: Path, adopt: bool) -> None:
    """Fit the chip's step constants (matmul efficiency, recompute weight: attention_kernel.ChipStep)
    to every step measured under `out`, least squares on the relative error over a grid; print
    each step's error in sample and with its decoder shape left out of the fit; with `adopt`,
    keep them in chip_kernels.json for the chip's generation."""
    from tpu_attention_kernel import GENERATION_OF_DEVICE

    from tpu_tuner.planner.prediction.attention_kernel import KERNELS_FILE

    runs = _measured_runs(out)
    grid = [(e / 1000, w / 100) for e in range(400, 951, 5) for w in range(0, 101, 5)]

    def best(kept: list[tuple[dict[str, Any], dict[str, Any]]]) -> tuple[float, float]:
        def loss(chip: tuple[float, float]) -> float:
            return sum((repredicted(p, chip)[0] / m["step_s_median"] - 1) ** 2 for p, m in kept)

        return min(grid, key=loss)

    chip = best(runs)
    print(f"fitted to {len(runs)} steps: matmul efficiency {chip[0]:.3f}, recompute weight {chip[1]:.2f}")
    worst_out = 0.0
    for predicted, measured in runs:
        others = best([(p, m) for p, m in runs if p["shape"] != predicted["shape"]])
        seen = measured["step_s_median"]
        inside, left_out = (repredicted(predicted, c)[0] / seen - 1 for c in (chip, others))
        worst_out = max(worst_out, abs(left_out))
        print(
            f"{predicted['shape'].removeprefix('decoder:'):70} {predicted['remat']:22} in sample {inside:+.1%}, "
            f"its shape left out {left_out:+.1%} (efficiency {others[0]:.3f}, weight {others[1]:.2f})"
        )
    if adopt:
        kept = json.loads(KERNELS_FILE.read_text())
        generation = GENERATION_OF_DEVICE[runs[0][1]["device"]]
        shapes = len({p["shape"] for p, _ in runs})
        kept[generation]["step"] = {
            "efficiency": chip[0],
            "recompute_weight": chip[1],
            "devices": 1,
            "fitted_to": f"{len(runs)} steps ({shapes} decoder shapes x remat policies), measured "
            f"{runs[0][1].get('date', '')}, libtpu {runs[0][1].get('libtpu')}; each shape left out: at most "
            f"{worst_out:.1%} off",
        }
        KERNELS_FILE.write_text(json.dumps(kept, indent=1) + "\n")
        print(f"kept for {generation} in {KERNELS_FILE}")


def table(out: Path) -> None:
    """Every step measured under `out`: the planner's prediction now against the chip's step, and
    the attention kernels' predicted time against the profile's flash ops."""
    rows = []
    for predicted, measured in _measured_runs(out):
        step, kernel = repredicted(predicted)
        flash = sum(ms for name, ms in measured.get("top_ops_ms_per_step") or [] if name.startswith("%flash")) / 1e3
        seen = measured["step_s_median"]
        rows.append(abs(seen / step - 1) <= 0.10)
        print(
            f"{predicted['shape'].removeprefix('decoder:'):70} {predicted['global_batch']:>2} x {predicted['seq_len']} "
            f"{predicted['remat']:22} blocks {predicted['flash_block'] or 128:>4}: predicted {step:.3f} s, measured "
            f"{seen:.3f} s ({seen / step - 1:+.1%}); attention predicted {kernel * 1e3:.1f} ms"
            + (f", the profile's flash kernels {flash * 1e3:.1f} ms" if flash else "")
        )
    print(f"{sum(rows)} of {len(rows)} steps predicted within 10% of the chip's")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("export", "run", "compare", "table", "fit"))
    parser.add_argument("--adopt", action="store_true", help="fit: keep the fitted constants for the planner")
    parser.add_argument("--out", type=Path, default=REPO / "results" / "tpu_check")
    parser.add_argument("--topology", default="v5e-1")
    parser.add_argument(
        "--shape", default=SHAPE, help="the planned model: a decoder: spec, a shape file or a model file"
    )
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--remats", default="full,save_dot_except_mlpwi,minimal", help="one point each")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--flash-block", type=int, help="the planned program's flash blocks (default: the planner's)")
    args = parser.parse_args()
    if args.what == "table":
        table(args.out)
        return
    if args.what == "fit":
        fit(args.out, args.adopt)
        return
    for remat in args.remats.split(","):  # each policy's point in a folder of its own
        folder = args.out / remat
        if args.what == "export":
            export(folder, args.shape, args.topology, args.global_batch, args.seq, remat, args.flash_block)
        elif not (folder / STEP_FILE).exists():
            print(f"{remat}: no exported step (nothing fit, or export was not run)")
        elif args.what == "run":
            run(folder, args.steps)
        else:
            compare(folder)


if __name__ == "__main__":
    main()
