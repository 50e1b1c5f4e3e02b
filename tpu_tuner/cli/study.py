"""`tpu-tune study status|finish|dashboard`: a study shared by several workers (--study), seen,
finished, or shown in optuna-dashboard (whose own command cannot open tpu-tune's PostgreSQL journal
by URL: `tpu_tuner.study_storage` opens it for Optuna's tools)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tpu_tuner.cli.common import add_out, dashboard_lines
from tpu_tuner.core.flags import DEVICE, STORAGE, STUDY, add_flag, device_or_none

NAME = "study"
HELP = "a study shared by several workers (--study): its status, or finish it"
DESCRIPTION = "See how far a shared study is, or verify its best once on this host and write the tuned config."
ACTIONS = (
    ("status", "trials done / running / failed, per worker, and the best so far"),
    ("finish", "verify the best against the baseline on this host, once; write the run folder"),
    ("dashboard", "serve optuna-dashboard over the storage's studies (pip install optuna-dashboard)"),
)
DASHBOARD_PORT = 8080  # optuna-dashboard's own default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The two actions and their flags."""
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, text in ACTIONS:
        sub = actions.add_parser(action, help=text, description=text)
        add_flag(
            sub,
            STORAGE.adapted(help="the study's storage URL (default: $TPU_TUNE_STORAGE, else OUT/studies.db)"),
            "storage",
        )
        add_out(sub)
        if action == "dashboard":
            sub.add_argument("--host", default="127.0.0.1", help="the address to serve on (default %(default)s)")
            sub.add_argument("--port", type=int, default=DASHBOARD_PORT, help="the port (default %(default)s)")
            continue
        add_flag(sub, STUDY.adapted(required=True), "study")
        if action == "finish":
            sub.add_argument(
                "--model",
                type=Path,
                metavar="FILE",
                help="the model file, where it lies elsewhere on this host than the study recorded",
            )
            add_flag(sub, DEVICE, "device")
            sub.add_argument(
                "--now",
                action="store_true",
                help="verify even while trials are still running (the best measured so far)",
            )


def run(args: argparse.Namespace) -> int:
    """Print the study's status, or verify its best here and write the run folder."""
    from tpu_tuner.cli.common import quiet_optuna
    from tpu_tuner.studies.storage import check_storage, shared_sqlite, storage_from_environment

    storage = args.storage or storage_from_environment() or shared_sqlite(args.out)
    check_storage(storage)
    quiet_optuna(args.debug)
    if args.action == "dashboard":
        return _serve_dashboard(storage, args.host, args.port)
    if args.action == "status":
        from tpu_tuner.tuning.run.study_admin import study_status

        print("\n".join(study_status(storage, args.study).lines()))
        return 0
    from tpu_tuner.api import finish_study

    result = finish_study(storage, args.study, args.out, args.model, device_or_none(args.device), now=args.now)
    print(f"speedup   {result.verification.message} (verified on {result.verification.host})")
    print(f"tuned     {result.verification.chosen.describe()}")
    print(f"results   {result.run_dir}/ (tuned_config.toml, report.md, trials.csv, plots)")
    for line in dashboard_lines(result.run_dir, storage):
        print(line)
    return 0


def _serve_dashboard(storage: str, host: str, port: int) -> int:
    """optuna-dashboard over `storage` until interrupted (a PostgreSQL study is in tpu-tune's
    journal, which `optuna-dashboard URL` cannot open: this passes it the opened storage)."""
    import importlib.util

    from tpu_tuner.api import study_storage
    from tpu_tuner.core.credentials import redact
    from tpu_tuner.core.errors import UserInputError

    if importlib.util.find_spec("optuna_dashboard") is None:
        raise UserInputError("tpu-tune study dashboard needs optuna-dashboard: pip install optuna-dashboard")
    import optuna_dashboard

    print(f"dashboard optuna-dashboard over {redact(storage)} at http://{host}:{port}/ (Ctrl-C stops it)")
    optuna_dashboard.run_server(study_storage(storage), host=host, port=port)
    return 0
