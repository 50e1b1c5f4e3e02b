"""Issue 58, item 5: the library leaves Optuna's logging as it finds it. `tuning/run/tune_run.py` set
Optuna's verbosity to WARNING when imported, changing a Python API user's own Optuna output; the
CLI now makes that choice for its terminal (`cli.common.quiet_optuna`), and the dashboard's
throwaway importance study restores the verbosity it found."""

from __future__ import annotations

import importlib
import io

import optuna
import pandas as pd
from helpers.common import TRIALS_CSV

from tpu_tuner.dashboard.analysis import knob_importance


def _at_info() -> int:
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.INFO)
    return before


def test_importing_the_tuner_leaves_optunas_verbosity_alone() -> None:
    before = _at_info()
    try:
        import tpu_tuner.tuning.run.tune_run as study

        importlib.reload(study)  # its import-time code runs again
        assert optuna.logging.get_verbosity() == optuna.logging.INFO
    finally:
        optuna.logging.set_verbosity(before)


def test_the_dashboards_importance_restores_the_verbosity_it_found() -> None:
    before = _at_info()
    try:
        assert knob_importance(pd.read_csv(io.StringIO(TRIALS_CSV)))
        assert optuna.logging.get_verbosity() == optuna.logging.INFO
    finally:
        optuna.logging.set_verbosity(before)
