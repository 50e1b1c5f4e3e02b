"""Do the planner's error bands decide? Coverage and median width of the bands (issue 57 item 3).

Each calibration row's leave-one-out error is checked against the band it would have been printed
with: the band made from the other rows alone, each with its own leave-one-out error among them
(`calibration.band_check`, a leave-one-out inside each leave-one-out: about 30 s on two cores
with the adopted model, no compiles). Printed: each row, then the share of rows inside their band and the median
band (+- MFU points), over every row and per generation. Targets: at least 90% inside and a
median band of at most 6 points.

    python benchmarks/plan_bands.py [--rows-file FILE] [--kind MODEL]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from tpu_tuner.planner.calibration.fitting import (
    ADOPTED,
    EFFICIENCY_MODELS,
    ROWS_FILE,
    band_check,
    load_rows,
    noise_floor,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_calibration import print_bands

log = logging.getLogger("plan_bands")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows-file", type=Path, default=ROWS_FILE, help="the calibration rows (default: the package's)"
    )
    parser.add_argument(
        "--kind", default=ADOPTED, choices=EFFICIENCY_MODELS, help="the cost model whose bands to check"
    )
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


if __name__ == "__main__":
    main()
