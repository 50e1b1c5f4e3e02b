"""`tpu-tune dashboard`: one HTML page of every run in a results folder, written or served."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "dashboard"
HELP = "one HTML page of every run, MFU, plan and bucketing result in a results folder"
DESCRIPTION = "Write RESULTS_DIR/dashboard.html (self-contained, works offline), or serve it with --serve."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The dashboard command's flags, their defaults read from the dashboard's."""
    from tpu_tuner.dashboard.page import DEFAULT_DETAILS
    from tpu_tuner.dashboard.serve import DEFAULT_PORT

    parser.add_argument("results_dir", type=Path, help="the results folder that holds the run folders")
    parser.add_argument("--out", type=Path, help="where to write the page (default: RESULTS_DIR/dashboard.html)")
    parser.add_argument("--csv", type=Path, help="also write the runs table as CSV here")
    parser.add_argument(
        "--serve",
        action="store_true",
        help="serve the page (re-rendered when runs change) and the folder's files until Ctrl-C",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind with --serve (default %(default)s)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="port with --serve (default %(default)s; 0: any free port)"
    )
    parser.add_argument(
        "--details",
        type=int,
        default=DEFAULT_DETAILS,
        help="tuning runs (newest first) with per-trial figures on the page (default %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    """Write the page (and the CSV), or serve it until Ctrl-C."""
    import signal

    from tpu_tuner.core.errors import UserInputError
    from tpu_tuner.dashboard import collect, make_server, write_csv, write_dashboard

    if args.details < 0:
        raise UserInputError(f"--details must be 0 or more, not {args.details}")
    if not args.serve or args.csv is not None:
        collection = collect(args.results_dir)
        if args.csv is not None:
            print(f"wrote {write_csv(collection, args.csv)}")
        if not args.serve:
            print(write_dashboard(args.results_dir, args.out, details=args.details, collection=collection))
            return 0
    server = make_server(args.results_dir, args.host, args.port, details=args.details)
    # A process started in the background by a non-interactive shell (`cmd &`, nohup, CI) inherits
    # SIGINT ignored, so Python would never raise KeyboardInterrupt: Ctrl-C / SIGINT must stop it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(f"serving {args.results_dir} on {server.url} (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        print("\nstopped")
    finally:
        server.server_close()
    return 0
