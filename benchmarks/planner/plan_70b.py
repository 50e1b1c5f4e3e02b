"""Wall time of planning a Llama-3.1-70B-shaped model on an 8192-chip v5p slice (issue 4's target:
at least 10 layouts in under 60 s), and the resulting table.

    python benchmarks/planner/plan_70b.py [--max-layouts 10] [--global-batch 8192] [--seq 4096] [--fast] [--workers N]
                                  [--topology v5p:16x16x32] [--slices N]

With --slices N the same slice is planned N times over (multi-slice over DCN, issue 36's target:
a 70B-class plan over 2 slices in under 2 minutes with --fast).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from tpu_tuner.outputs.plan_report import render_terminal
from tpu_tuner.planner.plans.plan import plan
from tpu_tuner.planner.plans.plan_options import PlanCompile, PlanEnumeration, PlanOptions, PlanStep, PlanTarget

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-layouts", type=int, default=10)
    parser.add_argument("--global-batch", type=int, default=8192)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--fast", action="store_true", help="the planner's --fast screening compile")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--topology", default="v5p:16x16x32", help="one slice")
    parser.add_argument("--slices", type=int, default=1, help="slices over DCN")
    args = parser.parse_args()
    start = time.perf_counter()
    result = plan(
        REPO / "examples" / "llama.py",
        PlanOptions(
            PlanTarget(args.topology, args.slices),
            step=PlanStep(preset="70b", global_batch=args.global_batch, seq_len=args.seq),
            enumeration=PlanEnumeration(max_layouts=args.max_layouts),
            compile=PlanCompile(fast_compile=args.fast, **({"workers": args.workers} if args.workers else {})),
        ),
        progress=lambda message: print(f"{time.perf_counter() - start:6.0f} s  {message}", flush=True),
    )
    wall = time.perf_counter() - start
    print(render_terminal(result, "examples/llama.py"))
    compile_times = [p.compiled.compile_seconds for p in result.plans]
    print(
        f"\n{args.topology} x {args.slices} slice(s), {'fast screening' if args.fast else 'full-effort'} compiles; "
        f"planned {len(result.plans)} layouts ({len(result.rejected)} rejected without compiling) in {wall:.0f} s "
        f"(target < {60 if args.slices == 1 else 120} s for >= 10 layouts); compile time per layout: "
        f"min {min(compile_times):.0f} s, max {max(compile_times):.0f} s"
    )


if __name__ == "__main__":
    main()
