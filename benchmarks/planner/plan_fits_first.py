"""Fits first on every calibration row (issue 57's first target): planned as a new user would,
with no layout, no remat policy and no micro-batch count given, `--fast --max-layouts 3`, is the
first plan a point that fits?

    python benchmarks/planner/plan_fits_first.py                  # plans the rows not kept yet, then the table
    python benchmarks/planner/plan_fits_first.py --only ID ...    # these rows (again)
    python benchmarks/planner/plan_fits_first.py --table          # the kept results, no compile

Each row is `tpu_tuner.planner.plans.plan.plan` (what `tpu-tune plan` runs) on the row's shape,
slice, batch, sequence, dtypes, optimizer, vocabulary tiling and 8-bit matmuls: the published
run's own settings but for its layout and remat policy, which the planner chooses. With
`--first` (the default) only the point the enumeration chooses first is compiled: a plan's first
row is its best fitting compiled point, so when that point fits the first plan of `--max-layouts
3` fits too; a row whose first point does not fit is planned again with all three. Results are
kept per row in benchmarks/planner/plan_fits_first.json as each row finishes (a rerun plans only the rows
not there), with libtpu's version and the date.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import time
from pathlib import Path

from published_calibration import Row, published_rows

from tpu_tuner.planner.compiler.xla_flags import parse_xla_flags
from tpu_tuner.planner.plans.plan import plan
from tpu_tuner.planner.plans.plan_options import (
    PlanCompile,
    PlanEnumeration,
    PlanOptions,
    PlanTarget,
)

HERE = Path(__file__).resolve().parent
KEPT = HERE / "plan_fits_first.json"
GIB = 2**30


def plan_row(row: Row, max_layouts: int, workers: int) -> dict:
    """Plan `row` with no layout, remat or micro-batches given; what its first plan is."""
    start = time.perf_counter()
    said: list[str] = []
    result = plan(
        row.spec,
        PlanOptions(
            PlanTarget(topology=row.topology, slices=row.slices),
            step=row.plan_step(),  # the published run's, but for its layout and remat policy
            enumeration=PlanEnumeration(max_layouts=max_layouts),
            compile=PlanCompile(workers=workers, fast_compile=True, xla_flags=parse_xla_flags(row.xla_flags)),
        ),
        said.append,
    )
    first = result.plans[0]
    estimate = (first.memory_estimate or {}).get("total")
    return {
        "id": row.id,
        "published": f"{row.layout.short()} {row.remat}",
        "max_layouts": max_layouts,
        "compiled": len(result.plans),
        "first": first.point.name(),
        "fits": first.fits,
        "why": first.why,
        "peak_gib": round(first.compiled.peak_bytes / GIB, 2) if not first.compiled.error else None,
        "limit_gib": round(result.topology.hbm_bytes_per_device / GIB, 2),
        "estimate_gib": round(estimate / GIB, 2) if estimate else None,
        "over_limit_accepted": first.over_limit_accepted,
        "effort": first.fit_effort,
        "predicted_mfu": round(first.predicted_mfu, 4),
        "widened": any("other remat policies or micro-batches" in line for line in said),
        "points": [
            {"point": p.point.name(), "fits": p.fits, "why": p.why[:300], "mfu": round(p.predicted_mfu, 4)}
            for p in result.plans
        ],
        "seconds": round(time.perf_counter() - start, 1),
        "libtpu": importlib.metadata.version("libtpu"),
        "host": f"{platform.node()}: {os.cpu_count()} cores",
        "date": datetime.date.today().isoformat(),
    }


def table(kept: dict[str, dict], rows: list[Row]) -> None:
    """The kept results, one row a line, and the share whose first plan fits."""
    print(f"{'row':38s} {'first plan (--fast --max-layouts 3)':70s} {'est':>6s} {'peak':>6s} {'HBM':>6s} fits")
    planned = [kept[r.id] for r in rows if r.id in kept]
    for entry in planned:
        peak = "" if entry["peak_gib"] is None else f"{entry['peak_gib']:6.1f}"
        estimate = "" if entry["estimate_gib"] is None else f"{entry['estimate_gib']:6.1f}"
        verdict = (
            ("yes" + (" (allocation accepted)" if entry["over_limit_accepted"] else "")) if entry["fits"] else "NO"
        )
        note = " [widened]" if entry["widened"] else ""
        limit = f"{entry['limit_gib']:6.1f}"
        print(f"{entry['id']:38s} {entry['first'][:70]:70s} {estimate:>6s} {peak:>6s} {limit} {verdict}{note}")
    missing = [r.id for r in rows if r.id not in kept]
    fitting = sum(1 for e in planned if e["fits"])
    print(f"\nfirst plan fits: {fitting} of {len(planned)} rows planned ({len(missing)} not planned yet)")
    if missing:
        print("not planned: " + ", ".join(missing))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=None, help="row ids to plan (again)")
    parser.add_argument("--table", action="store_true", help="print the kept results, plan nothing")
    parser.add_argument("--all-three", action="store_true", help="compile all three points of every row")
    parser.add_argument("--workers", type=int, default=1, help="compiler processes a plan (default 1)")
    parser.add_argument("--kept", type=Path, default=KEPT, help="the kept results (read, written)")
    args = parser.parse_args()
    rows = published_rows()[0]
    kept = json.loads(args.kept.read_text()) if args.kept.exists() else {}
    todo = [] if args.table else [r for r in rows if (r.id in args.only if args.only else r.id not in kept)]
    for row in todo:
        try:
            entry = plan_row(row, 3 if args.all_three else 1, args.workers)
            if not entry["fits"] and entry["max_layouts"] == 1:
                entry = plan_row(row, 3, args.workers)
        except Exception as exc:  # a row the planner refuses is reported, the others still planned
            print(f"{row.id}: not planned: {type(exc).__name__}: {exc}", flush=True)
            continue
        # Read again before writing: other processes may be planning other rows into the same file.
        kept = {**(json.loads(args.kept.read_text()) if args.kept.exists() else {}), row.id: entry}
        args.kept.write_text(json.dumps(kept, indent=1, sort_keys=True))
        print(f"{row.id}: {entry['first']}: fits {entry['fits']} ({entry['seconds']:.0f} s)", flush=True)
    table(kept, rows)


if __name__ == "__main__":
    main()
