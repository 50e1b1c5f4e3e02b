"""Sharding layouts measured on N ranks of this host: every layout's step time (slowest rank)
and peak memory per rank, interleaved over rounds, and the best against DDP with its interval.

    python benchmarks/parallel/sharding.py [--model examples/gpt.py] [--nproc 2] [--rounds 5] [--steps 8]

Each round launches every layout once (its own process group, PyTorch's launcher, gloo on CPU),
in a rotating order, as a sharded trial runs (`RankedTrialRunner`, a `ShardedStepRequest`): a
launch times `--steps` steps of the trial's own step after two warm-up steps, and its median is
that round's figure. A layout the model cannot run is reported with the rank's reason. The
numerics of each layout are checked first against the single-device fp32 reference
(`runner/sharded_check.py`).
"""

from __future__ import annotations

import argparse
import statistics

from tpu_tuner.metrics.paired import paired_speedup
from tpu_tuner.runner.ranked_runner import RankedTrialRunner
from tpu_tuner.runner.requests import ShardedStepRequest
from tpu_tuner.runner.sharded_check import check_layout


def layouts_for(nproc: int) -> list[str]:
    """Every layout of `nproc` ranks the layout knob searches (every family's splits), DDP first."""
    from tpu_tuner.knobs import registry as knobs
    from tpu_tuner.knobs.layout import FAMILIES

    return list(knobs.get("layout").choices("cpu", {"choices": {"cpu": list(FAMILIES)}}, ranks=nproc))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="examples/gpt.py")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    runnable = []
    for layout in layouts_for(args.nproc):
        checked = check_layout(args.model, layout, args.nproc, args.batch_size)
        if checked.ok:
            report = checked.reports[0]
            print(
                f"{layout}: numerics vs single device: loss {report['loss_error']:.1e}, "
                f"gradients {report['gradient_error']:.1e}"
            )
            runnable.append(layout)
        else:
            print(f"{layout}: cannot run ({checked.kind}): {checked.failure}")
    medians: dict[str, list[float]] = {layout: [] for layout in runnable}
    peaks: dict[str, list[int]] = {}
    states: dict[str, list[int]] = {}
    with RankedTrialRunner(args.model, args.device, args.nproc, timeout_s=600.0) as runner:
        for round_index in range(args.rounds):
            order = runnable[round_index % len(runnable) :] + runnable[: round_index % len(runnable)]
            for layout in order:
                result = runner.run(ShardedStepRequest(layout=layout, batch_size=args.batch_size, steps=args.steps))
                if not result.ok:
                    raise SystemExit(f"{layout} failed in round {round_index + 1}: {result.failure.message}")
                timing = result.value
                medians[layout].append(statistics.median(timing.step_seconds))
                peaks[layout] = timing.peak_bytes
                states[layout] = timing.state_bytes
    print(
        f"\n{args.model} on {args.nproc} ranks, {args.rounds} interleaved rounds of {args.steps} steps "
        "(slowest rank per step; median per round):"
    )
    baseline = runnable[0]
    for layout in runnable:
        per_rank = ", ".join(f"{p / 2**20:.0f}" for p in peaks[layout])
        state = ", ".join(f"{s / 2**20:.1f}" for s in states[layout])
        versus = "" if layout == baseline else paired_speedup(medians[baseline], medians[layout]).describe()
        print(
            f"  {layout:6} step {statistics.median(medians[layout]) * 1e3:8.1f} ms   model state per rank "
            f"[{state}] MiB   peak RSS per rank [{per_rank}] MiB   {versus}"
        )
    best = min(runnable, key=lambda layout: statistics.median(medians[layout]))
    if best != baseline:
        print(f"best: {best}, over {baseline} (DDP): {paired_speedup(medians[baseline], medians[best]).describe()}")
    else:
        print(f"best: {baseline} (DDP)")


if __name__ == "__main__":
    main()
