"""Figures derived from one tuning run's trials.csv: the Pareto front and what each knob contributed."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from tpu_tuner.dashboard.collect import KNOBS
from tpu_tuner.studies import records

log = logging.getLogger(__name__)


def measured_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """Completed trials that were measured (not repeats of an earlier setting), in trial order."""
    done = trials[trials["state"] == "COMPLETE"]
    if records.REPEAT_OF in done:
        done = done[done[records.REPEAT_OF].isna()]
    if records.AMORTISED_STEP_S in done:
        done = done[pd.to_numeric(done[records.AMORTISED_STEP_S], errors="coerce").notna()]
    return done.sort_values("number")


def pareto_front(trials: pd.DataFrame) -> pd.DataFrame:
    """The trials no other trial beats on both step time and accuracy error (both minimised)."""
    done = measured_trials(trials)
    if not len(done) or records.ACCURACY_ERROR not in done:
        return done.iloc[0:0]
    done = done[pd.to_numeric(done[records.ACCURACY_ERROR], errors="coerce").notna()]
    ordered = done.sort_values([records.AMORTISED_STEP_S, records.ACCURACY_ERROR])
    keep, best_error = [], np.inf
    for index, error in zip(ordered.index, ordered[records.ACCURACY_ERROR].astype(float)):
        if error < best_error:  # faster ones come first, so this one survives only if more accurate
            keep.append(index)
            best_error = error
    return ordered.loc[keep]


def knob_importance(trials: pd.DataFrame) -> dict[str, float]:
    """Optuna's (PED-ANOVA) importance of each searched knob for the amortised step time.

    The study is rebuilt in memory from trials.csv rather than loaded from its storage: that keeps
    the dashboard away from a SQLite file a live run is writing, and works when the storage was a
    database server this machine cannot reach. Returns {} when there is too little to say (fewer
    than two measured trials, or no knob that took more than one value).
    """
    import optuna

    done = measured_trials(trials)
    knobs = [k for k in KNOBS if k in done and done[k].notna().all() and done[k].nunique() > 1]
    if len(done) < 2 or not knobs:
        return {}
    distributions: dict[str, optuna.distributions.BaseDistribution] = {
        k: optuna.distributions.CategoricalDistribution(sorted(done[k].astype(str).unique())) for k in knobs
    }
    frozen = [
        optuna.trial.create_trial(
            params={k: str(row[k]) for k in knobs},
            distributions=distributions,
            value=float(row[records.AMORTISED_STEP_S]),
        )
        for _, row in done.iterrows()
    ]
    # A throwaway study to ask Optuna's importance of: its "new study created" line is no news,
    # and the caller's verbosity is restored (a library leaves Optuna's logging as it found it).
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(direction="minimize")
    finally:
        optuna.logging.set_verbosity(verbosity)
    study.add_trials(frozen)
    try:
        # PED-ANOVA: Optuna's default evaluator, deterministic and without scikit-learn (fANOVA needs it).
        evaluator = optuna.importance.PedAnovaImportanceEvaluator()
        return dict(optuna.importance.get_param_importances(study, evaluator=evaluator))
    except (RuntimeError, ValueError) as exc:
        log.info("no knob importance: %s", exc)
        return {}
