"""The dashboard's matplotlib figures, returned as PNG data URIs to embed in the page.

Figures are made with ``matplotlib.figure.Figure`` and the Agg canvas, never pyplot: pyplot keeps
global state, and the server renders pages from several threads. PNG at a modest resolution keeps
the page small (a detail figure is ~30-50 kB; the same as SVG is several times larger with many
points), which is what lets 200 runs stay under the 5 MB budget.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from tpu_tuner.core.units import si
from tpu_tuner.model.meshes.layouts import Layout

DPI = 80
# Every text at least 10 px where the page shows the PNG: at DPI px per inch that is 72 * 10 / DPI
# points (9 pt at 80 dpi), as long as the figure is not shrunk to fit the page (MAX_WIDTH_IN).
MIN_LABEL_PX = 10
SMALL = 72 * MIN_LABEL_PX / DPI
TITLE = SMALL + 1
# The widest figure a 1400 px window shows at its own size: 1400 px less a scrollbar (17 px), the
# body's margins (2 x 21 px), a <figure>'s (2 x 40 px) and the image's border (2 px);
# `img{max-width:100%}` shrinks a wider one, and its labels with it.
PAGE_PX = 1400
MAX_WIDTH_IN = (PAGE_PX - 17 - 2 * 21 - 2 * 40 - 2) / DPI
OK = "tab:blue"


def figure(
    width: float,
    height: float,
    bottom: float = 0.6,
    left: float = 0.75,
    top: float = 0.35,
    right: float = 0.15,
    wspace: float | None = None,
) -> Figure:
    """A figure with fixed margins (in inches). Not layout="constrained": the layout engine draws
    every figure twice, which was a third of the page's render time for 200 runs."""
    width = min(width, MAX_WIDTH_IN)  # wider would be shrunk by the page, and its labels with it
    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(
        left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height, wspace=wspace
    )
    return fig


def to_data_uri(fig: Figure) -> str:
    """Render `fig` as a base64 PNG data URI (the page needs no other file)."""
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def figure_uri(fig: Figure | None) -> str | None:
    """`to_data_uri` of a figure there may be no data for (None)."""
    return None if fig is None else to_data_uri(fig)


def step_split(prediction: dict[str, Any]) -> tuple[float, float, float]:
    """(compute, memory not hidden under compute, exposed communication) seconds; they sum to the step.

    predict.py: busy = max(compute, memory) + (1 - memory_overlap) * min(...); step = busy + exposed.
    """
    step = float(prediction["step_seconds"])
    exposed = float(prediction.get("exposed_comm_seconds") or 0.0)
    compute = min(float(prediction.get("compute_seconds") or 0.0), step - exposed)
    return compute, max(0.0, step - exposed - compute), exposed


def plan(plan_data: dict[str, Any]) -> str:
    """One planner result: predicted MFU per layout (fits or not) and each layout's step-time split."""
    plans = plan_data["plans"]
    labels = [Layout.from_mesh(p["layout"]).short(with_context=False) for p in plans]
    predictions = [p.get("prediction") for p in plans]
    width = min(max(8, 1.3 * len(labels)), MAX_WIDTH_IN)
    # Layout names side by side need ~0.075 in a character at SMALL; where they would collide, upright.
    longest = 0.075 * max(map(len, labels), default=1)
    crowded = len(labels) * (longest + 0.1) > (width - 0.75) / 2 - 0.3
    below = longest if crowded else 0.0
    fig = figure(width, 3.65 + below, bottom=0.75 + below, left=0.6, top=0.6, wspace=0.25)
    mfu_ax, split_ax = fig.subplots(1, 2)
    colors = [
        OK if p.get("fits") else "tab:gray" if (p.get("compiled") or {}).get("error") else "tab:red" for p in plans
    ]
    bands = [((p.get("band") or {}).get("points") or 0.0) if p.get("prediction") else 0.0 for p in plans]
    mfu_ax.bar(labels, [p["mfu"] * 100 if p else 0 for p in predictions], color=colors, yerr=bands, capsize=3)
    mfu_ax.set(
        title="predicted MFU ± its band\n(red: does not fit in HBM; grey: compiler failed)",
        ylabel="MFU, %",
        xlabel="layout data x fsdp x tensor",
    )
    splits = np.array([step_split(p) if p else (0.0, 0.0, 0.0) for p in predictions]) * 1e3
    bottom = np.zeros(len(labels))
    # Communication the model hides entirely is not modelled as exposed (the page's note says why).
    exposed = "exposed communication" + ("" if splits[:, 2].any() else ": none predicted (not modelled)")
    for column, (name, color) in enumerate(
        (("compute", OK), ("memory (not overlapped)", "tab:purple"), (exposed, "tab:orange"))
    ):
        split_ax.bar(labels, splits[:, column], bottom=bottom, color=color, label=name)
        bottom += splits[:, column]
    split_ax.set(title="predicted step time split", ylabel="ms per step", xlabel="layout data x fsdp x tensor")
    split_ax.set_ylim(0, max(bottom.max(), 1e-9) * 1.45)  # room above the bars for the legend
    split_ax.legend(fontsize=SMALL, loc="upper left")
    for ax in (mfu_ax, split_ax):
        ax.tick_params(labelsize=SMALL)
        ax.tick_params(axis="x", labelrotation=90 if crowded else 0)
        ax.title.set_fontsize(TITLE)
    return to_data_uri(fig)


def plan_scaling(points: pd.DataFrame) -> str | None:
    """Best predicted MFU against slice size (chips), one line per model; needs 2+ slice sizes."""
    if not len(points) or points.groupby("model")["chips"].nunique().max() < 2:
        return None
    fig = figure(6, 3.4, bottom=0.55)
    ax = fig.add_subplot()
    for model, group in points.groupby("model"):
        group = group.sort_values("chips")
        band = pd.to_numeric(group.get("band_points"), errors="coerce").fillna(0.0) if "band_points" in group else 0.0
        ax.errorbar(group["chips"], group["mfu"] * 100, yerr=band, marker="o", capsize=3, label=model)
        for chips, mfu, topology in zip(group["chips"], group["mfu"], group["topology"]):
            ax.annotate(topology, (chips, mfu * 100), fontsize=SMALL, textcoords="offset points", xytext=(3, 3))
    ax.set_xscale("log", base=2)
    ax.margins(x=0.12)  # room for the last point's topology label
    ax.set(xlabel="chips in the slice", ylabel="best predicted MFU (± its band), %")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=SMALL)
    return to_data_uri(fig)


def ranking(data: dict[str, Any]) -> str | None:
    """A ranking of slices: tokens per dollar and tokens/s per chip of each fitting slice, with the
    band (low-high) as error bars; None when no slice fits."""
    fitting = [s for s in data["slices"] if s.get("fits") and s.get("tokens_per_second_per_chip")]
    if not fitting:
        return None
    fig = figure(10, max(2.2, 0.9 + 0.4 * len(fitting)), bottom=0.5, left=1.1, top=0.35, wspace=0.3)
    dollar_ax, chip_ax = fig.subplots(1, 2, sharey=True)
    labels = [s["topology"] for s in fitting]
    y = np.arange(len(fitting))
    for ax, key, title in (
        (dollar_ax, "tokens_per_dollar", "tokens per $ (on-demand price)"),
        (chip_ax, "tokens_per_second_per_chip", "tokens/s per chip"),
    ):
        values = np.array([s.get(key) or 0.0 for s in fitting])
        low = np.array([s.get(f"{key}_low") or v for s, v in zip(fitting, values)])
        high = np.array([s.get(f"{key}_high") or v for s, v in zip(fitting, values)])
        ax.barh(
            y,
            values,
            xerr=[values - low, high - values],
            capsize=3,
            color=[OK if s.get(key) is not None else "tab:gray" for s in fitting],
        )
        for index, entry in enumerate(fitting):
            if entry.get(key) is None:
                ax.text(0, index, "  no price", va="center", fontsize=SMALL)
        ax.set_title(title, fontsize=TITLE)
        ax.tick_params(labelsize=SMALL)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: si(value, "").strip()))  # 13.7 G, not 1e10
        ax.grid(axis="x", alpha=0.3)
    dollar_ax.set_yticks(y, labels)
    dollar_ax.invert_yaxis()  # the ranking's first slice on top
    return to_data_uri(fig)


def buckets(data: dict[str, Any]) -> str:
    """The length histogram of a bucketing result, with the chosen bucket bounds."""
    hist = data["histogram"]
    fig = figure(7, 3, bottom=0.55)
    ax = fig.add_subplot()
    # One line collection, not a Rectangle per distinct length (hundreds of them).
    ax.vlines(hist["lengths"], 0, hist["counts"], color=OK, linewidth=1.5, label="sequences per length")
    ax.set_ylim(bottom=0)
    for index, bound in enumerate(data["chosen_buckets"]):
        ax.axvline(
            bound, color="tab:red", linestyle="--", linewidth=1, label="chosen bucket bounds" if index == 0 else None
        )
    ax.set(xlabel="sequence length", ylabel="sequences", title=f"{data['workload']}: lengths and chosen buckets")
    ax.title.set_fontsize(TITLE)
    ax.legend(fontsize=SMALL)
    return to_data_uri(fig)
