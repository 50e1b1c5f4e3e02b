"""Issue 5's benchmark: chosen buckets against powers of two and the oracle bound, measured.

Runs the whole `tpu-tune buckets` study on examples/encoder.py (its skewed length sample) with
the real compiler of this device (inductor on CPU, static shapes), then replays a drawn stream
of steps through the workload for every strategy that needs at most --replay-max-compiles shapes.
A planned run has --steps steps; the replay runs --replay of them, so each measured total is
measured compiles + (steps / replay) x measured stream step time (said again in the output).
Also times the optimiser alone on 100k samples with 10k distinct lengths.

    python benchmarks/bucketing/bucketing_replay.py [--steps 20000] [--replay 300] [--max-buckets 8]
        [--replay-max-compiles 16] [--only 'optimal (DP)' 'powers of two'] [--compile-backend inductor]
        [--heldout {fresh,shifted}] [--device tpu] [--align 128]

Targets: chosen measured total <= 0.8x powers of two's, and within 10% of the oracle bound.
With --heldout the buckets are chosen on the example's sample and the replay runs on lengths they
were not chosen on (issue 69): `fresh`, a new draw of the same law (seed 1); `shifted`, traffic
that drifted (median 140 tokens, sigma 0.85); target: chosen <= 0.8x powers of two made from them.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from tpu_tuner.bucketing import BucketCostModel, LengthHistogram, optimal_buckets
from tpu_tuner.bucketing.options import BucketChoice, BucketMeasurement, BucketReplay
from tpu_tuner.bucketing.study import BucketOptions, plan_buckets
from tpu_tuner.outputs.bucket_report import render_terminal

REPO = Path(__file__).resolve().parents[2]


def optimiser_speed() -> None:
    sample = np.random.default_rng(0).integers(1, 10_001, 100_000)
    hist = LengthHistogram.from_sample(sample)
    model = BucketCostModel(20.0, (0.002, 1e-5, 1e-9))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        optimal_buckets(hist, model, 20_000, 8, 1)
        times.append(time.perf_counter() - start)
    print(
        f"optimiser: {hist.total} samples, {len(hist.lengths)} distinct lengths, 8 buckets: "
        f"median {np.median(times) * 1e3:.0f} ms over 5 runs (max {max(times) * 1e3:.0f} ms)"
    )


# Held-out length laws (log-normal median and sigma, seed), as examples/encoder.py draws its sample.
HELDOUT = {"fresh": (110.0, 0.75, 1), "shifted": (140.0, 0.85, 2)}


def write_heldout(kind: str, folder: Path) -> Path:
    """10,000 held-out request lengths of law `kind`, clipped as the example's, one a line."""
    median, sigma, seed = HELDOUT[kind]
    lengths = np.exp(np.random.default_rng(seed).normal(np.log(median), sigma, size=10_000))
    path = folder / f"heldout_{kind}.txt"
    path.write_text("\n".join(str(int(v)) for v in np.clip(np.round(lengths), 4, 1024)) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--replay", type=int, default=300)
    parser.add_argument("--replay-max-compiles", type=int, default=16)
    parser.add_argument("--compile-backend", default=None)
    parser.add_argument("--max-buckets", type=int, default=8)
    parser.add_argument("--only", nargs="+", help="replay only these strategies, e.g. 'optimal (DP)' 'powers of two'")
    parser.add_argument("--heldout", choices=sorted(HELDOUT), help="replay on held-out lengths of this law")
    parser.add_argument("--device", default=None, help="the device to measure on (default: the host's)")
    parser.add_argument("--align", type=int, default=8, help="bounds are multiples of this (128 on a TPU)")
    args = parser.parse_args()
    optimiser_speed()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        result = plan_buckets(
            REPO / "examples" / "encoder.py",
            BucketOptions(
                choice=BucketChoice(planned_steps=args.steps, max_buckets=args.max_buckets, align=args.align),
                measure=BucketMeasurement(device=args.device, compile_backend=args.compile_backend),
                replay=BucketReplay(
                    steps=args.replay,
                    heldout_file=write_heldout(args.heldout, Path(folder)) if args.heldout else None,
                    max_compiles=args.replay_max_compiles,
                    only=tuple(args.only) if args.only else None,
                ),
            ),
            progress=lambda message: print(f"{time.perf_counter() - start:6.0f} s  {message}", flush=True),
        )
    print(render_terminal(result))
    table = result.heldout.table if result.heldout else result.table
    measured = {r.strategy: r for r in result.replays}
    chosen, powers = measured.get("optimal (DP)"), measured.get("powers of two")
    for r in result.replays:
        predicted = next(e.total_seconds for e in table if e.strategy.name == r.strategy)
        print(
            f"  {r.strategy:18s} measured {r.total_seconds:8.0f} s (compiles {r.compile_seconds:6.1f} s over "
            f"{r.compiled_shapes} shapes, stream {r.stream_step_seconds:6.2f} s for {r.stream_steps} steps); "
            f"predicted {predicted:8.0f} s ({(predicted / r.total_seconds - 1):+.1%})"
        )
    if chosen and powers:
        on = f"on held-out lengths ({args.heldout})" if args.heldout else "on the sample"
        ratio = chosen.total_seconds / powers.total_seconds
        print(f"chosen / powers of two (measured, {on}): {ratio:.3f} (target <= 0.8)")
    if chosen and powers and not args.heldout:  # the oracle bound is the sample's
        print(
            f"chosen measured / oracle bound: {chosen.total_seconds / result.oracle_seconds:.3f} (target <= 1.10); "
            f"oracle = {result.oracle_seconds:.0f} s: every step at its exact length under the measured step-time fit, "
            "compiles free"
        )
    print(f"whole benchmark {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
