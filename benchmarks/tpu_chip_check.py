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

    python benchmarks/tpu_chip_check.py export [--out results/tpu_check] [--topology v5e-1]
    python benchmarks/tpu_chip_check.py run [--out results/tpu_check] [--steps 20]
    python benchmarks/tpu_chip_check.py compare [--out results/tpu_check]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# Llama-shaped (heads 128 wide), ~335M parameters: AdamW state and activations fit one v5e chip (16 GiB).
SHAPE = "decoder:vocab=32000,d_model=1024,layers=16,heads=8,mlp=4096,max_seq_len=2048"
STEP_FILE = "step.jaxexport"
PREDICTED_FILE = "predicted.json"
MEASURED_FILE = "measured.json"


def export(
    out: Path, shape: str, topology: str, global_batch: int, seq_len: int, remat: str, flash_block: int | None
) -> None:
    """Plan `shape` on `topology` with the policy `remat`, then write the best point's step and its
    prediction into `out`."""
    # The project (and torch) only here: `run` must work where neither is installed.
    from dataclasses import replace

    from tpu_tuner.planner.compiler.compile_pool import run_job
    from tpu_tuner.planner.plans.plan import plan
    from tpu_tuner.planner.plans.plan_options import PlanOptions, PlanStep, PlanTarget
    from tpu_tuner.planner.plans.plan_problem import build_problem
    from tpu_tuner.planner.topology import parse_topology

    options = PlanOptions(PlanTarget(topology), step=PlanStep(global_batch=global_batch, seq_len=seq_len, remat=remat))
    result = plan(shape, options, progress=print)
    best = result.best
    if best is None or best.prediction is None:
        print(f"{remat}: nothing fits {topology}: {[p.why for p in result.plans]}")
        return
    problem = build_problem(shape, options, parse_topology(topology), print)
    out.mkdir(parents=True, exist_ok=True)
    job = replace(
        problem.job(best.point, problem.dims.scanned, fast=False),
        export_to=str(out / STEP_FILE),
    )
    job = replace(job, step=replace(job.step, flash_block=flash_block))
    exported = run_job(job)
    prediction = best.prediction
    record = {
        "shape": shape,
        "topology": topology,
        "global_batch": global_batch,
        "seq_len": seq_len,
        "layout": str(best.layout),
        "remat": best.remat,
        "flash_block": flash_block,
        "accumulation": best.accumulation,
        "vocab": problem.dims.shape.vocab,
        "model_flops_per_step": result.model_flops_per_step,
        "compiled_flops": best.compiled.flops,
        "predicted_step_s": prediction.step_seconds,
        "predicted_compute_s": prediction.compute_seconds,
        "predicted_memory_s": prediction.memory_seconds,
        "predicted_mfu": prediction.mfu,
        "predicted_tokens_per_s": prediction.tokens_per_second,
        "band_points": best.band.points if best.band else None,
        "planned_peak_bytes": best.compiled.peak_bytes,
        "planned_allocated_bytes": best.compiled.allocated_bytes,
        "exported_peak_bytes": exported.peak_bytes,
        "peak_tflops_per_device": result.topology.peak_flops_per_device / 1e12,
    }
    (out / PREDICTED_FILE).write_text(json.dumps(record, indent=1))
    print(json.dumps(record, indent=1))


def run(out: Path, steps: int) -> None:
    """Run the step exported into `out` on this machine's first device and write what it measured."""
    import jax
    import jax.numpy as jnp
    import numpy as np

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
    if not by_op:  # another libtpu may name its planes otherwise: say what there was
        return [
            (f"no XLA Ops line; plane {plane.name}: {[line.name for line in plane.lines]}", 0.0) for plane in planes
        ]
    return by_op.most_common(15)


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


def attention_blocks(out: Path, shape: tuple[int, int, int, int] = (8, 16, 2048, 64)) -> None:
    """On the chip: causal attention's forward and backward through the planner's kernel (Pallas
    flash attention) at its default 128 blocks and at larger ones, and through splash attention
    at MaxText's default 512 blocks (``sa_block_*`` in MaxText's base.yml)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu import flash_attention as flash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    batch, heads, seq, head_dim = shape
    q, k, v = (jax.random.normal(jax.random.key(i), shape, jnp.bfloat16) for i in range(3))

    def flash_with(block: int | None) -> Any:
        sizes = None if block is None else flash.BlockSizes(*(block, block, block, 1), *(block,) * 7)
        return lambda q, k, v: flash.flash_attention(q, k, v, causal=True, sm_scale=head_dim**-0.5, block_sizes=sizes)

    def splash_with(block: int) -> Any:
        mask = masks.MultiHeadMask([masks.CausalMask((seq, seq))] * heads)
        kernel = splash.make_splash_mha(
            mask=mask, head_shards=1, q_seq_shards=1, block_sizes=splash.BlockSizes(*(block,) * 3, *(block,) * 5)
        )
        return lambda q, k, v: jax.vmap(kernel)(q * head_dim**-0.5, k, v)

    variants = {
        "flash, default blocks (128)": flash_with(None),
        "flash, 512": flash_with(512),
        "flash, 1024": flash_with(1024),
        "splash, 512 (MaxText's default)": splash_with(512),
    }
    flops = 2 * batch * heads * seq * seq * head_dim * 3.5  # causal: half of 4bhs^2d forward, backward 2.5x
    results = {}
    for name, attend in variants.items():

        def loss(q: Any, k: Any, v: Any, attend: Any = attend) -> Any:
            return attend(q, k, v).astype(jnp.float32).sum()

        step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        jax.block_until_ready(step(q, k, v))
        start = time.perf_counter()
        for _ in range(10):
            grads = step(q, k, v)
        jax.block_until_ready(grads)
        ms = (time.perf_counter() - start) / 10 * 1e3
        results[name] = {"ms_forward_and_backward": ms, "tflops": flops / ms / 1e9}
        print(f"{name:34} {ms:8.2f} ms  {flops / ms / 1e9:6.1f} TFLOP/s")
    (out / "attention_blocks.json").write_text(json.dumps({"shape": shape, **results}, indent=1))


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
            f"{predicted['planned_peak_bytes'] / gib:.2f} "
            f"(exported program {predicted['exported_peak_bytes'] / gib:.2f})",
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("export", "run", "compare", "attention"))
    parser.add_argument("--out", type=Path, default=REPO / "results" / "tpu_check")
    parser.add_argument("--topology", default="v5e-1")
    parser.add_argument(
        "--shape", default=SHAPE, help="the planned model: a decoder: spec, a shape file or a model file"
    )
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--remats", default="full,save_dot_except_mlpwi,minimal", help="one point each")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument(
        "--flash-block",
        type=int,
        default=512,
        help="the exported program's flash blocks (MaxText's 512; 0: the kernel's 128)",
    )
    args = parser.parse_args()
    args.flash_block = args.flash_block or None
    if args.what == "attention":
        args.out.mkdir(parents=True, exist_ok=True)
        attention_blocks(args.out)
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
