"""One tuning run's figure: optimisation history, MFU per trial, speed against accuracy error, and
what each knob contributed (measured by the verification where the run has it, else the search's
knob importance, labelled as the variance share it is)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

import tpu_tuner.dashboard.plots as plots
from tpu_tuner.dashboard.analysis import knob_importance, measured_trials, pareto_front
from tpu_tuner.dashboard.contributions import Contribution, Contributions
from tpu_tuner.outputs.superseded_marks import mark_superseded, superseded_rows, window_amortised
from tpu_tuner.studies import records

_OK = "tab:blue"
_WIDTH_IN = 13.0
# A label's width at SMALL: about 0.075 in a character (DejaVu Sans at 9 pt).
_CHAR_IN = 0.075


def run_detail(trials: pd.DataFrame, contributions: Contributions | None = None) -> str:
    """One tuning run: history, MFU per trial, speed against accuracy error, and each knob's measured
    contribution (or, without one, the search's knob importance).

    No title: the page puts the run's name above it.
    """
    done = measured_trials(trials)
    measured = contributions.measured if contributions else []
    importance = {} if measured else knob_importance(trials)
    names = [c.knob for c in measured] or list(importance)
    # A fixed layout, not "constrained": the layout engine was over half of this figure's render time,
    # and this figure is drawn once per tuning run. The knob panel sits right of a gap its names fit in.
    fig = Figure(figsize=(_WIDTH_IN, 3.2))
    grid = fig.add_gridspec(1, 3, left=0.045, right=0.67, bottom=0.16, top=0.9, wspace=0.42)
    history, mfu, pareto = (fig.add_subplot(grid[0, column]) for column in range(3))
    label_in = 0.5 + _CHAR_IN * max(map(len, names), default=8)
    knobs = fig.add_subplot(
        fig.add_gridspec(1, 1, left=0.67 + label_in / _WIDTH_IN, right=0.975, bottom=0.16, top=0.9)[0]
    )
    number = done["number"].to_numpy()
    step_ms = done[records.AMORTISED_STEP_S].to_numpy(dtype=float) * 1e3
    feasible = (
        done[records.FEASIBLE].fillna(False).astype(bool).to_numpy()
        if records.FEASIBLE in done
        else np.ones(len(done), bool)
    )

    history.scatter(number[feasible], step_ms[feasible], s=14, color=_OK, label="feasible")
    history.scatter(number[~feasible], step_ms[~feasible], s=14, color="tab:red", marker="x", label="too inaccurate")
    if len(done):
        history.step(
            number,
            np.minimum.accumulate(np.where(feasible, step_ms, np.inf)),
            where="post",
            color="tab:green",
            label="best so far",
        )
    # One figure per setting: a search figure a window superseded is marked, the window's shown.
    marked = superseded_rows(done)
    if marked.any():
        mark_superseded(history, number[marked], step_ms[marked], window_amortised(done)[marked] * 1e3)
    history.set(title="optimisation history", xlabel="trial", ylabel="amortised step, ms")
    history.legend(fontsize=plots.SMALL)

    mfu_values = pd.to_numeric(done.get(records.MFU), errors="coerce").to_numpy(dtype=float) * 100 if len(done) else []
    if marked.any():  # the bar is the window's MFU; the search's is the hollow mark
        window_mfu = pd.to_numeric(done[records.WINDOW_MFU], errors="coerce").to_numpy(dtype=float) * 100
        mark_superseded(mfu, number[marked], mfu_values[marked], window_mfu[marked])
        mfu_values = np.where(marked & np.isfinite(window_mfu), window_mfu, mfu_values)
    mfu.bar(number, mfu_values, color=[_OK if f else "tab:red" for f in feasible])
    # One run, one device: the run's heading names the device and the peak this is a share of.
    mfu.set(title="MFU per trial", xlabel="trial", ylabel="MFU, % of the device's peak")

    _pareto(pareto, trials, done, step_ms)
    if measured:
        _contributions(knobs, measured)
    else:
        _importance(knobs, importance)
    for ax in (history, mfu, pareto, knobs):
        ax.tick_params(labelsize=plots.SMALL)
        ax.title.set_fontsize(plots.TITLE)
    return plots.to_data_uri(fig)


def _pareto(ax: Axes, trials: pd.DataFrame, done: pd.DataFrame, step_ms: np.ndarray) -> None:
    """Each trial's step against its accuracy error, with the Pareto front."""
    if len(done) and records.ACCURACY_ERROR in done:
        error = pd.to_numeric(done[records.ACCURACY_ERROR], errors="coerce").to_numpy(dtype=float)
        # Exact fp32 matches have error 0, which a log axis cannot show: they sit at a floor.
        floor = np.nanmin(error[error > 0]) / 10 if (error > 0).any() else 1e-12
        ax.scatter(step_ms, np.maximum(error, floor), s=14, color="tab:gray", label="trial")
        front = pareto_front(trials)
        ax.plot(
            front[records.AMORTISED_STEP_S].astype(float) * 1e3,
            np.maximum(front[records.ACCURACY_ERROR].astype(float), floor),
            marker="o",
            color="tab:orange",
            label="Pareto front",
        )
        ax.set_yscale("log")
        ax.minorticks_off()  # minor ticks of log axes are many Line2D objects: a tenth of the render
        ax.legend(fontsize=plots.SMALL)
    ax.set(title="speed against accuracy error", xlabel="amortised step, ms", ylabel="relative error")


def _contributions(ax: Axes, measured: list[Contribution]) -> None:
    """Each knob's measured speedup with its interval, against 1x (no effect); the largest on top."""
    ordered = sorted(measured, key=lambda c: c.speedup)
    y = np.arange(len(ordered))
    speedup = np.array([c.speedup for c in ordered])
    low, high = np.array([c.ci_low for c in ordered]), np.array([c.ci_high for c in ordered])
    ax.barh(y, speedup, xerr=[speedup - low, high - speedup], capsize=3, color=_OK)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)  # 1x: the knob changes nothing
    for index, c in enumerate(ordered):
        ax.text(c.ci_high, index, f" {c.speedup:.2f}x", va="center", fontsize=plots.SMALL)
    ax.set_yticks(y, [c.knob for c in ordered])
    ax.set_xlim(0, float(high.max()) * 1.35)  # room for the figures right of the intervals
    ax.set_ylim(-0.6, len(ordered) - 0.4)
    # The interval's level is in the table under the figure: a long label would run off the figure.
    ax.set(title="what each knob contributed (measured)", xlabel="speedup with the knob")


def _importance(ax: Axes, importance: dict[str, float]) -> None:
    """The search's knob importance: a share of the step time's variance, not a speedup."""
    if importance:
        names = list(importance)[::-1]
        ax.barh(names, [importance[n] for n in names], color=_OK)
        ax.set(xlim=(0, 1))
    else:
        ax.text(0.5, 0.5, "too few trials\nto rank the knobs", ha="center", va="center", transform=ax.transAxes)
    ax.set(title="knob importance (PED-ANOVA)", xlabel="variance share, not a speedup")
