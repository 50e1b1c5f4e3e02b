"""Do the planner's error bands decide? Coverage and median width of the bands (issue 57 item 3).

Each calibration row's leave-one-out error is checked against the band it would have been printed
with: the band made from the other rows alone, each with its own leave-one-out error among them
(`calibration.band_check`, a leave-one-out inside each leave-one-out: about 30 s on two cores
with the adopted model, no compiles). Printed: each row, then the share of rows inside their band and the median
band (+- MFU points), over every row and per generation. Targets: at least 90% inside and a
median band of at most 6 points.

Then whole groups are left out (issue 70, `calibration.group_check`): one generation, one source
(a README table, a recipe log) and one model family at a time, each left-out row predicted from
the other groups' rows and given the band made from them alone. Printed per group, then a table
of coverage, mean absolute error and median band: row-wise beside each grouping. Targets under
leave-one-group-out: at least 90% inside, a median band of at most 8 points.

Both tables are printed without and with the band's widening for novelty (prediction/novelty.py,
calibration/widening.py): row-wise, each row's widening fitted from the other rows' group-wise
errors; group-wise, nested: a left-out group's widening fitted from the other groups' rows
alone, each left out by source and family among themselves (a few minutes; `--no-widening`
skips it).

    python benchmarks/planner/plan_bands.py [--rows-file FILE] [--kind MODEL] [--no-widening]
        [--groupings generation source family]
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import replace
from pathlib import Path

from plan_calibration import print_bands

from tpu_tuner.planner.calibration.fitting import (
    ADOPTED,
    EFFICIENCY_MODELS,
    ROWS_FILE,
    band_check,
    load_rows,
    noise_floor,
)
from tpu_tuner.planner.calibration.group_check import GROUPINGS, Cache, Checked, group_check, row_checked, summary
from tpu_tuner.planner.calibration.widening import fit_widening, nested_factors, row_factors, widening_entries

log = logging.getLogger("plan_bands")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows-file", type=Path, default=ROWS_FILE, help="the calibration rows (default: the package's)"
    )
    parser.add_argument(
        "--kind", default=ADOPTED, choices=EFFICIENCY_MODELS, help="the cost model whose bands to check"
    )
    parser.add_argument(
        "--groupings",
        nargs="*",
        default=list(GROUPINGS),
        choices=list(GROUPINGS),
        help="the groupings to leave out whole (default: all; none: row-wise only)",
    )
    parser.add_argument("--no-widening", action="store_true", help="the bands without the novelty widening only")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows = load_rows(args.rows_file)
    floor = noise_floor()
    start = time.perf_counter()
    checked = band_check(rows, args.kind, floor)
    log.info(
        "%s over %d rows, noise floor %.2f points (%.0f s): each row's leave-one-out error against its band",
        args.kind,
        len(rows),
        floor,
        time.perf_counter() - start,
    )
    print_bands(rows, checked)
    before: dict[str, list[Checked]] = {"row-wise (leave one row out)": row_checked(rows, checked)}
    after: dict[str, list[Checked]] = {}
    cache: Cache = {}
    if not args.no_widening:
        # The widening (novelty.py) for each row fitted from the other rows' group-wise entries.
        start = time.perf_counter()
        entries = widening_entries(rows, args.kind, floor, cache)
        log.info(
            "\nwidening a unit of novelty distance, fitted to every row left out by source and family: %.3f",
            fit_widening(entries),
        )
        widened = band_check(rows, args.kind, floor, per_distance=row_factors(entries))
        log.info("row-wise with the widening (%.0f s):", time.perf_counter() - start)
        print_bands(rows, widened)
        after["row-wise (leave one row out)"] = row_checked(rows, widened)
    for grouping in args.groupings:
        start = time.perf_counter()
        key = GROUPINGS[grouping]
        factors = None if args.no_widening else nested_factors(rows, args.kind, key, floor, cache)
        by_group = group_check(rows, args.kind, key, floor, per_distance=factors, cache=cache)
        log.info("\nleave one %s out (%.0f s):", grouping, time.perf_counter() - start)
        print_groups(by_group)
        name = f"leave one {grouping} out"
        before[name] = [replace(c, band=replace(c.band, points=c.base)) for c in by_group]
        if not args.no_widening:
            after[name] = by_group
    for title, table in (("without the widening", before), ("with the widening (nested)", after)):
        if table:
            print(f"\n{title}:")
            print_table(table)


def print_table(table: dict[str, list[Checked]]) -> None:
    """Coverage, mean absolute error and median band of each validation, as a markdown table."""
    print("| validation | groups | rows | inside their band | mean abs. error | median band |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, result in table.items():
        fig = summary(result)
        inside = sum(c.inside for c in result)
        print(
            f"| {name} | {fig.groups} | {fig.rows} | {inside} ({fig.coverage:.0%}) | "
            f"{fig.mean_abs_error:.2f} | ±{fig.median_band:.2f} |"
        )


def print_groups(checked: list[Checked]) -> None:
    """Each left-out row's error and band (with the reasons it names), then each group's figures."""
    for c in checked:
        print(
            f"  {c.row.id:>36} {c.group[:40]:>40} error {c.error:+6.1f}  band {c.base:5.1f} -> {c.band.points:5.1f} "
            f"{'inside ' if c.inside else 'OUTSIDE'}" + (f"  ({'; '.join(c.band.reasons)})" if c.band.reasons else "")
        )
    for group in sorted({c.group for c in checked}):
        s = summary([c for c in checked if c.group == group])
        print(
            f"  {group:>52}: {s.rows:>2} rows, inside {s.coverage:4.0%}, "
            f"MAE {s.mean_abs_error:5.2f}, median band +-{s.median_band:5.2f}"
        )


if __name__ == "__main__":
    main()
