"""Reading a finished tuning run's folder back (`TuningResult.load`): run.json and result.json
checked to be a finished run's, the study loaded from the run's storage, the searched space
rebuilt. Each refusal is a one-line `UserInputError` naming the folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna

from tpu_tuner.core import run_folder
from tpu_tuner.core.errors import UserInputError, first_line
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.studies.liveness import read_storage
from tpu_tuner.tuning.options.tune_options import TuneOptions
from tpu_tuner.tuning.search.search_space import SearchSpace

RESULT_FORMAT = 1  # result.json's layout; raise it when a change makes old files unreadable


def read_finished_run(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """run.json and result.json of a finished tuning run, or a one-line UserInputError naming
    the folder and what makes it something else."""
    from tpu_tuner.studies import run_file

    if not run_dir.is_dir():
        raise UserInputError("not a finished tuning run: no such folder", run_dir)
    state = run_file.read(run_dir)
    if "storage" not in state or "study_name" not in state:
        raise UserInputError(
            f"not a finished tuning run: no readable {run_folder.RUN_JSON} with the study's storage", run_dir
        )
    status = state.get("status", "done")
    if status != "done":
        reason = f" ({state['reason']})" if state.get("reason") else ""
        raise UserInputError(f"not a finished tuning run: {run_folder.RUN_JSON} says {status!r}{reason}", run_dir)
    path = run_dir / run_folder.RESULT_JSON
    if not path.is_file():
        raise UserInputError(
            f"not a finished tuning run: no {run_folder.RESULT_JSON} (runs written before it existed cannot be loaded)",
            run_dir,
        )
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserInputError(f"unreadable {run_folder.RESULT_JSON}: {first_line(exc)}", run_dir) from exc
    if not isinstance(record, dict) or record.get("format") != RESULT_FORMAT:
        raise UserInputError(f"{run_folder.RESULT_JSON}: not a result of format {RESULT_FORMAT}", run_dir)
    return state, record


def load_study(run_dir: Path, state: dict[str, Any], storage: str | None) -> tuple[optuna.Study, str]:
    """The run's study and the URL it was loaded from: study.db in the folder when the run used
    the default SQLite (the stored absolute path goes stale when a folder is moved), else the
    stored URL."""
    from tpu_tuner.core.credentials import redact, without_password

    stored = str(state["storage"])
    url = stored
    if storage is not None:
        if without_password(storage) != without_password(stored):
            raise UserInputError(f"storage {redact(storage)!r} is not the run's storage {redact(stored)!r}", run_dir)
        url = storage
    elif stored.startswith("sqlite:"):
        local = run_dir / run_folder.STUDY_DB
        if local.is_file():
            url = f"sqlite:///{local.resolve()}"
        elif not Path(stored.removeprefix("sqlite:///")).is_file():
            raise UserInputError(f"the run's study database is gone ({run_folder.STUDY_DB} and {stored})", run_dir)
    try:
        return optuna.load_study(study_name=str(state["study_name"]), storage=read_storage(url)), url
    except Exception as exc:
        # Driver messages quote the URL, password included: redact the whole line.
        raise UserInputError(redact(f"cannot load the study from {url!r}: {first_line(exc)}"), run_dir) from exc


def load_space(data: Any, options: TuneOptions, profile: Profile) -> SearchSpace:
    """The space the run searched, as stored; loaded again by name when the stored form no
    longer matches the SearchSpace class (a newer version of tpu-tune)."""
    from tpu_tuner.core.plain_data import from_plain

    try:
        return from_plain(SearchSpace, data)
    except (TypeError, ValueError, KeyError, AttributeError):
        return SearchSpace.for_profile(options.search.space, profile, ranks=options.runner.ranks)


__all__ = ["RESULT_FORMAT", "load_space", "load_study", "read_finished_run"]
