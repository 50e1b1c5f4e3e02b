"""The runs' MFU figures: MFU over time and the best MFU per model, one figure per device kind, and
the roofline of every device.

MFU is a share of a peak, and a chip's peak (its spec table) and a CPU's (measured on the host by the
probe) are different kinds of number: 12 % of a TPU v5e's 197 TFLOP/s and 5 % of a 153 GFLOP/s host
share no scale worth comparing. So, as XProf reports FLOPS utilisation per device and MLPerf's result
tables name each row's accelerator rather than put different hardware on one normalised scale, an MFU
figure holds one device kind, its title says which, and its axis says every run in it is against its
own device's peak (the page heads each kind's figures with those peaks, device_labels.kind_title).
The roofline alone draws every device on one pair of axes: its axes are absolute (FLOP/s, FLOP per
byte), where a chip and a host do compare, and each roof is named.
"""

from __future__ import annotations

import math

import matplotlib.dates as mdates
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from tpu_tuner.core.units import si
from tpu_tuner.dashboard.device_labels import MFU_AXIS, device_label, kind_of, peak_text, text
from tpu_tuner.dashboard.plots import OK, SMALL, TITLE, figure

# A kind's two MFU figures side by side on a 1400 px page: its 1341 px of content less two <figure>s'
# margins and borders (2 x 82 px) and the gap between them (14 px) leave 1163 px, 14.5 in at 80 dpi.
OVER_TIME_IN = 6.5
BEST_LABELS_IN, BEST_BARS_IN = 3.9, 4.1
# Roofline points: a device's colour (its roof's), a model's marker.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def measured(runs: pd.DataFrame) -> pd.DataFrame:
    """Readable profiles and tuning runs that have an MFU."""
    if not len(runs):
        return runs
    rows = runs[(runs["status"] == "ok") & runs["kind"].isin(["tune", "profile"])]
    return rows[pd.to_numeric(rows["mfu"], errors="coerce").notna()]


def _kind_name(rows: pd.DataFrame) -> str:
    """The device kind(s) of `rows` as a figure's title names them ("TPU"; the page passes one kind)."""
    return " + ".join(sorted({kind_of(k).upper() for k in rows["device"]}))


def _on(row: pd.Series | dict) -> str:
    """A model on its device, by the device's name: the figure's title already names the kind."""
    return f"{row['model']} on {text(row['device_name']) or text(row['device']) or 'an unknown device'}"


def mfu_over_time(rows: pd.DataFrame) -> Figure | None:
    """MFU of each profile and tuning run of one device kind against time, one line per model and
    device: a tuning run goes from its baseline MFU at its start (its baseline profile) to its chosen
    MFU at its end. The time axis spans the runs' own times: one run of a minute reads in seconds."""
    rows = measured(rows)
    if not len(rows):
        return None
    fig = figure(OVER_TIME_IN, 3.6, bottom=0.7, top=0.45)
    ax = fig.add_subplot()
    points = _mfu_points(rows)
    for index, (_, group) in enumerate(points.groupby(["model", "device_name"], dropna=False, sort=False)):
        color = f"C{index % 10}"
        # Each run its own line: one run's end joined to the next run's baseline would read as a drop.
        for number, (_, run) in enumerate(group.groupby("run", sort=False)):
            run = run.sort_values("time")
            ax.plot(
                run["time"], run["mfu"] * 100, marker="o", color=color, label=_on(run.iloc[0]) if not number else None
            )
    ax.set_title(f"{_kind_name(rows)} runs: MFU over time", fontsize=TITLE)
    ax.set_ylabel(MFU_AXIS)
    ax.set_xlabel("time (UTC)")
    ax.set_ylim(0, max(1.0, float(points["mfu"].max()) * 100 * 1.25))  # room above the lines
    first, last = points["time"].min(), points["time"].max()
    # A margin of a twentieth of the span; a single instant gets a minute either side.
    pad = (last - first) / 20 if last > first else pd.Timedelta(minutes=1)
    ax.set_xlim(first - pad, last + pad)
    locator = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    # Seconds as 23:13:40, not a bare "40" beside minute ticks such as "23:14".
    formats = ["%Y", "%b", "%d", "%H:%M", "%H:%M", "%H:%M:%S"]
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, formats=formats))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=SMALL, loc="lower left")  # "best" searches every point: slow with 200 runs
    return fig


def _mfu_points(rows: pd.DataFrame) -> pd.DataFrame:
    """(run, model, device, device_name, time, mfu) of each run's end, and of each tuning run's start
    where its baseline profile dates it."""
    ends = rows.assign(time=rows["date"], mfu=rows["mfu"].astype(float))
    tuned = rows[(rows["kind"] == "tune") & rows["started"].notna() & (rows["started"] < rows["date"])]
    tuned = tuned[pd.to_numeric(tuned["baseline_mfu"], errors="coerce").notna()]
    starts = tuned.assign(time=tuned["started"], mfu=tuned["baseline_mfu"].astype(float))
    columns = ["run", "model", "device", "device_name", "time", "mfu"]
    return pd.concat([starts[columns], ends[columns]], ignore_index=True)


def mfu_per_model_figure(rows: pd.DataFrame) -> Figure | None:
    """Best MFU each model reached on each device of one kind, as a bar against that device's peak
    (100 %), labelled with the peak: one horizontal bar a model and device."""
    rows = measured(rows)
    if not len(rows):
        return None
    best = rows.assign(mfu=rows["mfu"].astype(float)).sort_values("mfu")
    best = best.groupby(["model", "device", "device_name"], dropna=False).tail(1)
    labels = [_on(row) for _, row in best.iterrows()]
    # Horizontal bars: a model name of any length sits on its own line, never over its neighbour's.
    left = min(BEST_LABELS_IN, 0.3 + 0.08 * max(map(len, labels)))
    fig = figure(left + BEST_BARS_IN, 1.2 + 0.32 * len(labels), bottom=0.5, left=left, top=0.45)
    ax = fig.add_subplot()
    y = np.arange(len(labels))
    ax.barh(y, best["mfu"] * 100, color=OK)
    # No legend: the axis says what 100 is, and a legend box would sit on a short figure's labels.
    ax.axvline(100, color="black", linestyle="--", linewidth=1)
    for index, (_, row) in enumerate(best.iterrows()):
        peak = peak_text(row, basis=False)
        said = f"{row['mfu']:.1%}" + (f" of {peak}" if peak else "")
        # Beside a short bar; inside a long one, where beside it would run off the figure.
        inside = row["mfu"] > 0.6
        x = row["mfu"] * 100 + (-1 if inside else 1)
        ax.text(
            x,
            index,
            said,
            va="center",
            ha="right" if inside else "left",
            fontsize=SMALL,
            color="white" if inside else "black",
        )
    ax.set_yticks(y, labels, fontsize=SMALL)
    ax.set_ylim(-0.6, len(labels) - 0.4)
    ax.set_title(f"{_kind_name(rows)} runs: best MFU per model", fontsize=TITLE)
    ax.set_xlabel(f"best {MFU_AXIS}")
    ax.set_xlim(0, 150)  # room right of the bars for the peak they are of
    ax.tick_params(labelsize=SMALL)
    return fig


def roofline_figure(runs: pd.DataFrame) -> Figure | None:
    """Achieved FLOP/s against arithmetic intensity per profiled step, under each device's roof,
    every device on one pair of axes (absolute figures compare across devices; MFU does not). Each
    roof names its device, kind and name, and whether its peak is a spec or a measurement; a device
    with several roofs (runs' probes differ) names their runs."""
    rows = measured(runs)
    if not len(rows):
        return None
    cols = ["arithmetic_intensity", "achieved_flops_per_s", "peak_flops_per_s", "peak_bytes_per_s"]
    rows = rows.dropna(subset=cols)
    if not len(rows):
        return None
    fig = figure(10.5, 3.8, bottom=0.55, left=0.85, right=4.7)
    ax = fig.add_subplot()
    intensity = rows["arithmetic_intensity"].astype(float)
    x = np.logspace(math.log10(max(intensity.min() / 10, 1e-2)), math.log10(intensity.max() * 10), 100)
    devices = list(dict.fromkeys(zip(rows["device"].map(text), rows["device_name"].map(text))))
    colour = {device: f"C{index % 10}" for index, device in enumerate(devices)}
    roofs = rows.groupby(["device", "device_name", "peak_flops_per_s", "peak_bytes_per_s"], dropna=False)
    for (kind, device, peak, bandwidth), group in roofs:
        basis = text(group["peak_basis"].iloc[0]) if "peak_basis" in group else ""
        # The device on a line of its own: a host's name alone can be 40 characters.
        ax.plot(
            x,
            np.minimum(peak, bandwidth * x),
            linewidth=1,
            color=colour[(text(kind), text(device))],
            label=f"{device_label(kind, device)}\n  {si(peak, 'FLOP/s')}, {si(bandwidth, 'B/s')}"
            + (f" ({basis} peak)" if basis else "")
            + _probed_by(rows, device, group),
        )
    models = list(dict.fromkeys(rows["model"]))
    for (model, kind, device), group in rows.groupby(["model", "device", "device_name"], dropna=False):
        ax.scatter(
            group["arithmetic_intensity"],
            group["achieved_flops_per_s"],
            marker=MARKERS[models.index(model) % len(MARKERS)],
            color=colour[(text(kind), text(device))],
            zorder=3,
            label=f"{model} on {device_label(kind, device)}",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.minorticks_off()
    ax.set_xlabel("arithmetic intensity, FLOP per byte")
    ax.set_ylabel("achieved FLOP/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=SMALL, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    return fig


def _probed_by(rows: pd.DataFrame, device: str, group: pd.DataFrame) -> str:
    """Which runs' roofline probe a roof is, where one device has several (a probe measures the
    host at one moment: two runs on one host can measure 698 and 778 GFLOP/s)."""
    if rows.loc[rows["device_name"] == device, ["peak_flops_per_s", "peak_bytes_per_s"]].drop_duplicates().shape[0] < 2:
        return ""
    runs = list(group["run"])
    return f"\n  probe of {runs[0]}" + (
        f"\n  and of {len(runs) - 1} more run(s) (the runs table)" if len(runs) > 1 else ""
    )
