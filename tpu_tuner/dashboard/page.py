"""The dashboard as one self-contained HTML page: tables, embedded PNG plots, a few lines of JS to sort.

Nothing is fetched: CSS and JS are inline and the plots are data URIs, so the file works offline
and can be mailed or archived. The only links are relative ones to the run folders' own reports.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

import tpu_tuner.dashboard.mfu_plots as mfu_plots
import tpu_tuner.dashboard.plots as plots
import tpu_tuner.dashboard.run_figure as run_figure
from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.run_folder import ACCURACY_PNG, HISTORY_PNG, MFU_PNG, write_atomic
from tpu_tuner.dashboard.collect import collect
from tpu_tuner.dashboard.collection import Collection
from tpu_tuner.dashboard.contributions import contributions_html
from tpu_tuner.dashboard.device_labels import by_kind, device_label, kind_of, kind_title, mfu_of, peak_text
from tpu_tuner.dashboard.folder_files import finite
from tpu_tuner.dashboard.html_cells import esc, figure_html, note, num_cell, pct, sortable_table
from tpu_tuner.dashboard.planner_sections import buckets_section, plans_section, rankings_section

log = logging.getLogger(__name__)

# Per-run detail figures are the page's main cost (0.3-0.4 s and 50 kB each here); past this many
# tuning runs the older ones link to the plots their own run folder already holds.
DEFAULT_DETAILS = 6

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.5em;margin-bottom:.2em} h2{margin-top:1.6em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;font-size:12px} th,td{padding:3px 8px;border-bottom:1px solid #e4e4e4;text-align:left}
th.sortable{cursor:pointer;background:#f4f4f4;user-select:none} th.sortable:hover{background:#e8e8f4}
th[aria-sort=ascending]::after{content:" \\25B2"} th[aria-sort=descending]::after{content:" \\25BC"}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.note{background:#fff8e0;border-left:4px solid #e0b000;padding:.4em .8em;margin:.4em 0}
.bad{background:#fde8e8;border-left:4px solid #c00;padding:.4em .8em;margin:.4em 0}
.muted{color:#777} img{max-width:100%;border:1px solid #eee;margin:.3em 0}
.figs{display:flex;flex-wrap:wrap;gap:1em;align-items:flex-start}
/* a caption wraps at its image's width, so that a device kind's two figures sit side by side */
.figs figure{display:table} .figs figcaption{display:table-caption;caption-side:bottom}
"""

# Click a header to sort by it; numbers sort by their data-v value, text by its words.
_JS = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th.sortable").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var asc = th.getAttribute("aria-sort") !== "ascending";
      table.querySelectorAll("th").forEach(function (h) { h.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", asc ? "ascending" : "descending");
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      function key(row) { var c = row.cells[col]; var v = c.getAttribute("data-v");
        return v === null ? c.textContent.trim().toLowerCase() : (v === "" ? null : parseFloat(v)); }
      rows.sort(function (a, b) { var x = key(a), y = key(b);
        if (x === null) return 1; if (y === null) return -1;
        return (x < y ? -1 : x > y ? 1 : 0) * (asc ? 1 : -1); });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
"""


def _speedup(row: pd.Series) -> str:
    if not finite(row["speedup"]):
        return "–"
    text = f"{row['speedup']:.2f}x"
    if finite(row["speedup_ci_low"]) and finite(row["speedup_ci_high"]):
        text += f" [{row['speedup_ci_low']:.2f}–{row['speedup_ci_high']:.2f}]"
    if row["significant"] is False or row["significant"] == 0:
        text += " (not significant)"
    return text


# The runs the table lists: those measured on a device (plans and rankings are predictions, listed in
# their own sections). A bucketing run measures compile and step times, no MFU.
_MEASURED_KINDS = ["tune", "profile", "buckets"]


def _mfu_cell(row: pd.Series, column: str, classes: str = "num") -> str:
    """An MFU cell that says on hover whose peak it is of; a bucketing run's says it measures none."""
    value = row[column]
    if row["kind"] == "buckets":
        why = "a bucketing run measures compile and step times, not MFU"
        return f'<td class="{classes}" data-v="" title="{esc(why)}">–</td>'
    sort = repr(float(value)) if finite(value) else ""
    return f'<td class="{classes}" data-v="{sort}" title="{esc(mfu_of(row))}">{esc(pct(value))}</td>'


def _peak_cell(row: pd.Series) -> str:
    """The peak both MFU cells are shares of ("197 TFLOP/s bfloat16, spec"), its source on hover."""
    if row["kind"] == "buckets":
        return '<td class="num peak" data-v="">–</td>'
    peak = row["peak_flops_per_s"]
    sort = repr(float(peak)) if finite(peak) else ""
    said = peak_text(row) or "not recorded"
    return f'<td class="num peak" data-v="{sort}" title="{esc(row["peak_source"])}">{esc(said)}</td>'


def _runs_table(runs: pd.DataFrame) -> str:
    rows = runs[runs["kind"].isin(_MEASURED_KINDS) & (runs["status"] != "unreadable")] if len(runs) else runs
    if not len(rows):
        return '<p class="note">No tuning run, profile or bucketing run to list.</p>'
    head = [
        "run",
        "kind",
        "model",
        "device",
        "date",
        "baseline MFU",
        "MFU",
        "of peak (the device's own)",
        "verified speedup [interval]",
        "accuracy error",
        "trials",
        "failures",
        "chosen settings",
        "status",
    ]
    out = [sortable_table(head, 'id="runs" class="sortable"')]
    for _, row in rows.iterrows():
        name = esc(row["run"])
        link = f'<a href="{esc(row["report"])}">{name}</a>' if row["report"] else name
        date = row["date"]
        kind, device = kind_of(row["device"]), device_label(row["device"], row["device_name"])
        out.append(
            f'<tr data-run="{name}" data-device-kind="{esc(kind)}"><td>{link}</td><td>{esc(row["kind"])}</td>'
            f'<td>{esc(row["model"])}</td><td class="device">{esc(device)}</td>'
            + num_cell(
                date.timestamp() if not pd.isna(date) else None,
                date.strftime("%Y-%m-%d %H:%M") if not pd.isna(date) else "",
            )
            + _mfu_cell(row, "baseline_mfu")
            + _mfu_cell(row, "mfu", "num mfu")
            + _peak_cell(row)
            + num_cell(row["speedup"], _speedup(row))
            + num_cell(row["accuracy_error"], f"{row['accuracy_error']:.2e}" if finite(row["accuracy_error"]) else "–")
            + num_cell(row["trials"], f"{row['trials']:.0f}" if finite(row["trials"]) else "–")
            + num_cell(row["failures"], f"{row['failures']:.0f}" if finite(row["failures"]) else "–")
            + f'<td>{esc(row["settings"])}</td><td title="{esc(row["reason"])}">{esc(row["status"])}</td></tr>'
        )
    out.append("</tbody></table>")
    return "".join(out)


def _details(collection: Collection, limit: int) -> str:
    runs = collection.runs
    tuned = runs[(runs["kind"] == "tune") & runs["run"].isin(list(collection.trials))] if len(runs) else runs
    if not len(tuned):
        return '<p class="note">No tuning run with a trials.csv yet.</p>'
    out = []
    for index, (_, row) in enumerate(tuned.iterrows()):
        run = row["run"]
        if index < limit:
            peak = peak_text(row)
            title = f"{run}: {row['model']} on {device_label(row['device'], row['device_name'])}" + (
                f" (MFU of its {peak} peak)" if peak else ""
            )
            out.append(
                f'<section class="run" id="run-{esc(run)}"><h3>{esc(title)}</h3>'
                + figure_html(
                    run_figure.run_detail(collection.trials[run], collection.contributions.get(run)),
                    f"trials of {run}",
                    "",
                )
                + contributions_html(collection.contributions.get(run))
                + "</section>"
            )
        else:
            links = [
                f'<a href="{esc(run)}/{name}">{label}</a>'
                for name, label in (
                    (HISTORY_PNG, "history"),
                    (MFU_PNG, "MFU per trial"),
                    (ACCURACY_PNG, "speed vs accuracy"),
                )
                if (collection.root / run / name).exists()
            ]
            out.append(f'<p class="muted">{esc(run)}: ' + (", ".join(links) or "no plots") + "</p>")
    if len(tuned) > limit:
        out.insert(
            limit,
            note(
                f"Figures for the newest {limit} tuning runs; older ones link to the plots in their own "
                "folder (`tpu-tune dashboard --details N` shows more)."
            ),
        )
    return "".join(out)


def _mfu_section(runs: pd.DataFrame) -> str:
    """Per device kind (chips first), its runs' MFU over time and best MFU per model, headed by whose
    peaks they are of; then the roofline of every device. One notice when nothing has an MFU."""
    rows = mfu_plots.measured(runs)
    if not len(rows):
        return note("No MFU measured yet: no readable tuning run or profile.")
    out = []
    for kind, group in by_kind(rows):
        # One section a device kind: a chip's MFU (of its spec peak) and a host's (of its measured
        # peak) never share an axis (mfu_plots.py says why).
        out.append(
            f'<section class="mfu-kind" data-device-kind="{esc(kind)}"><h3>{esc(kind_title(kind, group))}</h3>'
            '<div class="figs">'
            + figure_html(
                plots.figure_uri(mfu_plots.mfu_over_time(group)),
                f"{kind.upper()} runs: MFU over time, each run against its own device's peak; a tuning run: "
                "baseline at start, chosen at end",
                "",
            )
            + figure_html(
                plots.figure_uri(mfu_plots.mfu_per_model_figure(group)),
                f"{kind.upper()} runs: best MFU per model and device, against that device's own peak",
                "",
            )
            + "</div></section>"
        )
    out.append(
        '<section class="roofline"><h3>Roofline: every device under its own roof</h3>'
        + figure_html(
            plots.figure_uri(mfu_plots.roofline_figure(runs)),
            "roofline: achieved FLOP/s against arithmetic intensity, in absolute units that compare across "
            "devices (a tuning run contributes its baseline profile)",
            "No profile with arithmetic intensity and peaks for a roofline.",
        )
        + "</section>"
    )
    return "".join(out)


def render_page(collection: Collection, details: int = DEFAULT_DETAILS, refresh_s: int | None = None) -> str:
    """The whole page as one HTML string. `refresh_s`: reload period while runs are live (served only)."""
    runs = collection.runs
    unreadable = runs[runs["status"] == "unreadable"] if len(runs) else runs
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
    ]
    if refresh_s:
        parts.append(f'<meta http-equiv="refresh" content="{int(refresh_s)}">')
    parts.append(f"<title>tpu-tune dashboard: {esc(collection.root.name)}</title><style>{_CSS}</style></head><body>")
    parts.append(
        f"<h1>tpu-tune dashboard</h1><p class=muted>{esc(collection.root)}: {len(runs)} run folders, "
        f"generated {generated}</p>"
    )
    parts += [note(text, "note missing") for text in collection.missing()]
    live = runs[runs["status"] == "running"] if len(runs) else runs
    if len(live):
        parts.append(
            f'<p class="note live">Still running: {esc(", ".join(live["run"]))}'
            + (f" (this page reloads every {refresh_s} s)" if refresh_s else "")
            + "</p>"
        )
    if len(unreadable):
        parts.append('<h2>Unreadable run folders</h2><ul id="unreadable">')
        parts += [f'<li class="bad"><b>{esc(r["run"])}</b>: {esc(r["reason"])}</li>' for _, r in unreadable.iterrows()]
        parts.append("</ul>")
    parts.append("<h2>Runs</h2>" + _runs_table(runs))
    parts.append("<h2>MFU</h2>" + _mfu_section(runs))
    parts.append("<h2>Tuning runs</h2>" + _details(collection, details))
    parts.append("<h2>Which TPU to rent</h2>" + rankings_section(collection))
    parts.append("<h2>Plans</h2>" + plans_section(collection))
    parts.append("<h2>Buckets</h2>" + buckets_section(collection))
    parts.append(f"<script>{_JS}</script></body></html>")
    return "".join(parts)


def write_dashboard(
    root: str | Path,
    out: str | Path | None = None,
    details: int = DEFAULT_DETAILS,
    collection: Collection | None = None,
) -> Path:
    """Collect `root` (unless `collection` is given) and write the page, by default to ROOT/dashboard.html."""
    collection = collection if collection is not None else collect(root)
    path = Path(out) if out is not None else Path(root) / "dashboard.html"
    page = render_page(collection, details=details)
    try:
        write_atomic(path, page)  # a served or open page is never read half-written
    except OSError as exc:
        raise UserInputError(f"cannot write the dashboard: {exc.strerror or exc}", path) from exc
    log.info("dashboard of %d run folders written to %s (%.0f kB)", len(collection.runs), path, len(page) / 1e3)
    return path
