"""The tuning run's plots (PNG, matplotlib, headless): history, MFU per trial, speed vs accuracy."""

from __future__ import annotations

from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # headless: no display on CI machines or servers
import matplotlib.pyplot as plt
import numpy as np

from tpu_tuner.core.failures import MEASURED_AGAIN
from tpu_tuner.core.run_folder import ACCURACY_PNG, HISTORY_PNG, MFU_PNG
from tpu_tuner.outputs.figure_file import save_figure
from tpu_tuner.outputs.superseded_marks import mark_superseded, superseded_rows, window_amortised
from tpu_tuner.studies import records

if TYPE_CHECKING:
    from pathlib import Path

    from tpu_tuner.tuning.run.tuning_result import TuningResult


def write_plots(result: TuningResult) -> dict[str, Path]:
    """Write the plots into the run folder; returns {title: path}."""
    frame = result.trials_dataframe()
    done = frame[frame["state"] == "COMPLETE"] if "state" in frame else frame.iloc[0:0]
    out = {}
    out["Optimisation history"] = _history(result, done)
    out["MFU per trial"] = _mfu(result, frame, done)
    out["Speed against accuracy error"] = _pareto(result, done)
    return out


def _history(result: TuningResult, done) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    if len(done):
        values = done[records.AMORTISED_STEP_S].to_numpy(dtype=float) * 1e3
        feasible = done[records.FEASIBLE].astype(bool).to_numpy()
        ax.scatter(done["number"][feasible], values[feasible], label="feasible trial", color="tab:blue")
        ax.scatter(
            done["number"][~feasible], values[~feasible], label="infeasible (accuracy)", color="tab:red", marker="x"
        )
        best = np.minimum.accumulate(np.where(feasible, values, np.inf))
        ax.step(done["number"], best, where="post", color="tab:green", label="best feasible so far")
        marked = superseded_rows(done)
        if marked.any():
            window = window_amortised(done) * 1e3
            mark_superseded(ax, done["number"].to_numpy()[marked], values[marked], window[marked])
    ax.set_xlabel("trial")
    ax.set_ylabel(f"amortised step time, ms ({result.options.objective.planned_steps} planned steps)")
    ax.set_title("Optimisation history")
    ax.legend(loc="best", fontsize=8)
    return save_figure(fig, result.run_dir / HISTORY_PNG, dpi=100)


def _mfu(result: TuningResult, frame, done) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    if len(done):
        colors = ["tab:blue" if f else "tab:red" for f in done[records.FEASIBLE].astype(bool)]
        heights = done[records.MFU].to_numpy(dtype=float) * 100
        marked = superseded_rows(done)
        if marked.any():  # the bar is the window's MFU; the search's is the hollow mark above or below it
            window = done[records.WINDOW_MFU].to_numpy(dtype=float) * 100
            numbers = done["number"].to_numpy()[marked]
            mark_superseded(ax, numbers, heights[marked], window[marked])
            heights = np.where(marked & np.isfinite(window), window, heights)
            ax.legend(loc="best", fontsize=8)
        ax.bar(done["number"], heights, color=colors)
    kind = frame[records.FAILURE_KIND] if records.FAILURE_KIND in frame else None
    failed = (
        frame[frame["state"].isin(["FAIL", "PRUNED"]) & kind.notna() & ~kind.isin(list(MEASURED_AGAIN))]
        if kind is not None
        else frame.iloc[0:0]
    )
    for number in failed["number"]:
        ax.axvline(number, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("trial (red: accuracy violation; dotted: failed; orange: the window's figure stands)")
    ax.set_ylabel("MFU, %")
    ax.set_title(f"MFU per trial on {result.profile.device.name}")
    return save_figure(fig, result.run_dir / MFU_PNG, dpi=100)


def _baseline_error(done) -> float:
    """The baseline's error against fp32 the trials were judged beside (0 where none was stored)."""
    if not len(done) or records.BASELINE_ACCURACY_ERROR not in done:
        return 0.0
    errors = done[records.BASELINE_ACCURACY_ERROR].dropna()
    return float(errors.iloc[0]) if len(errors) else 0.0


def _pareto(result: TuningResult, done) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    if len(done):
        error = np.maximum(done[records.ACCURACY_ERROR].to_numpy(dtype=float), 1e-9)  # log axis: exact matches at 1e-9
        step = done[records.STEP_MEDIAN_S].to_numpy(dtype=float) * 1e3
        ax.scatter(error, step, color="tab:blue")
        marked = superseded_rows(done)
        if marked.any():
            window = done[records.WINDOW_STEP_S].to_numpy(dtype=float) * 1e3
            mark_superseded(ax, error[marked], step[marked], window[marked])
        for number, x, y in zip(done["number"], error, step):
            ax.annotate(str(number), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        order = np.argsort(error)
        front_x, front_y, best = [], [], np.inf
        for i in order:  # a point is on the front when no more-accurate point is faster
            if step[i] < best:
                best = step[i]
                front_x.append(error[i])
                front_y.append(step[i])
        ax.step(front_x, front_y, where="post", color="tab:green", label="Pareto front")
        ax.set_xscale("log")
    tolerance = result.options.objective.tolerance
    # The guardrail bounds the error beyond the baseline's (docs/tuning.md), so the line sits there.
    baseline = _baseline_error(done)
    ax.axvline(
        baseline + tolerance,
        color="tab:red",
        linestyle="--",
        label=f"baseline's error {baseline:.2g} + tolerance {tolerance:g}" if baseline else f"tolerance {tolerance:g}",
    )
    ax.set_xlabel("relative error against the fp32 eager reference (1e-9 = exact)")
    ax.set_ylabel("steady step time, ms")
    ax.set_title("Speed against accuracy error")
    ax.legend(loc="best", fontsize=8)
    return save_figure(fig, result.run_dir / ACCURACY_PNG, dpi=100)
