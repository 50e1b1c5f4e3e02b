"""The dashboard as one self-contained HTML page: tables, embedded PNG plots, a few lines of JS to sort.

Nothing is fetched: CSS and JS are inline and the plots are data URIs, so the file works offline
and can be mailed or archived. The only links are relative ones to the run folders' own reports.
"""

from __future__ import annotations

import html
import logging
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

import tpu_tuner.dashboard.plots as plots
from tpu_tuner.dashboard.collect import Collection, collect
from tpu_tuner.dashboard.folder_files import finite
from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.units import ms
from tpu_tuner.core.run_folder import ACCURACY_PNG, HISTORY_PNG, MFU_PNG, write_atomic
from tpu_tuner.model.layouts import Layout
from tpu_tuner.outputs.ranking_report import HEADER as RANKING_HEADER, cells as ranking_cells, notes as ranking_notes

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


def _e(value: Any) -> str:
    return html.escape("" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value))


def _pct(value: Any) -> str:
    return f"{value:.1%}" if finite(value) else "–"


def _num_cell(value: Any, text: str) -> str:
    sort = repr(float(value)) if finite(value) else ""
    return f'<td class="num" data-v="{sort}">{_e(text)}</td>'


def _speedup(row: pd.Series) -> str:
    if not finite(row["speedup"]):
        return "–"
    text = f"{row['speedup']:.2f}x"
    if finite(row["speedup_ci_low"]) and finite(row["speedup_ci_high"]):
        text += f" [{row['speedup_ci_low']:.2f}–{row['speedup_ci_high']:.2f}]"
    if row["significant"] is False or row["significant"] == 0:
        text += " (not significant)"
    return text


def _runs_table(runs: pd.DataFrame) -> str:
    rows = runs[runs["kind"].isin(["tune", "profile"]) & (runs["status"] != "unreadable")] if len(runs) else runs
    if not len(rows):
        return '<p class="note">No tuning run or profile to list.</p>'
    head = ["run", "kind", "model", "device", "date", "baseline MFU", "MFU", "verified speedup [95% CI]",
            "accuracy error", "trials", "failures", "chosen settings", "status"]
    out = ['<table id="runs" class="sortable"><thead><tr>']
    out += [f'<th class="sortable">{h}</th>' for h in head]
    out.append("</tr></thead><tbody>")
    for _, row in rows.iterrows():
        name = _e(row["run"])
        link = f'<a href="{_e(row["report"])}">{name}</a>' if row["report"] else name
        date = row["date"]
        out.append(
            f'<tr data-run="{name}"><td>{link}</td><td>{_e(row["kind"])}</td><td>{_e(row["model"])}</td>'
            f'<td title="{_e(row["device_name"])}">{_e(row["device"])}</td>'
            + _num_cell(date.timestamp() if not pd.isna(date) else None,
                        date.strftime("%Y-%m-%d %H:%M") if not pd.isna(date) else "")
            + _num_cell(row["baseline_mfu"], _pct(row["baseline_mfu"]))
            + f'<td class="num mfu" data-v="{repr(float(row["mfu"])) if finite(row["mfu"]) else ""}" '
              f'title="of the {_e(row["peak_dtype"])} peak">{_pct(row["mfu"])}</td>'
            + _num_cell(row["speedup"], _speedup(row))
            + _num_cell(row["accuracy_error"], f"{row['accuracy_error']:.2e}" if finite(row["accuracy_error"]) else "–")
            + _num_cell(row["trials"], f"{row['trials']:.0f}" if finite(row["trials"]) else "–")
            + _num_cell(row["failures"], f"{row['failures']:.0f}" if finite(row["failures"]) else "–")
            + f'<td>{_e(row["settings"])}</td><td title="{_e(row["reason"])}">{_e(row["status"])}</td></tr>')
    out.append("</tbody></table>")
    return "".join(out)


def _figure(uri: str | None, alt: str, missing: str) -> str:
    if uri is None:
        return f'<p class="note">{_e(missing)}</p>'
    return f'<figure><img src="{uri}" alt="{_e(alt)}"><figcaption class="muted">{_e(alt)}</figcaption></figure>'


def _details(collection: Collection, limit: int) -> str:
    runs = collection.runs
    tuned = runs[(runs["kind"] == "tune") & runs["run"].isin(list(collection.trials))] if len(runs) else runs
    if not len(tuned):
        return '<p class="note">No tuning run with a trials.csv yet.</p>'
    out = []
    for index, (_, row) in enumerate(tuned.iterrows()):
        run = row["run"]
        if index < limit:
            title = f"{run}: {row['model']} on {row['device']}"
            out.append(f'<section class="run" id="run-{_e(run)}"><h3>{_e(title)}</h3>'
                       + _figure(plots.run_detail(collection.trials[run]), f"trials of {run}", "")
                       + "</section>")
        else:
            links = [f'<a href="{_e(run)}/{name}">{label}</a>' for name, label in (
                (HISTORY_PNG, "history"), (MFU_PNG, "MFU per trial"), (ACCURACY_PNG, "speed vs accuracy"))
                if (collection.root / run / name).exists()]
            out.append(f'<p class="muted">{_e(run)}: ' + (", ".join(links) or "no plots") + "</p>")
    if len(tuned) > limit:
        out.insert(limit, f'<p class="note">Figures for the newest {limit} tuning runs; older ones link to the '
                          f'plots in their own folder (`tpu-tune dashboard --details N` shows more).</p>')
    return "".join(out)


def _plans(collection: Collection) -> str:
    if not collection.plans:
        return '<p class="note">No planner result (<code>tpu-tune plan</code>) in this folder.</p>'
    out, points = [], []
    runs = collection.runs.set_index("run")
    for run, data in collection.plans.items():
        row = runs.loc[run]
        out.append(f'<section class="plan"><h3>{_e(row["model"])} on {_e(row["topology"])} '
                   f'({_e(int(row["chips"]) if finite(row["chips"]) else "?")} chips) <a href="{_e(row["report"])}">{_e(run)}</a></h3>')
        out.append('<table class="sortable"><thead><tr>' + "".join(
            f'<th class="sortable">{h}</th>' for h in ("layout", "fits", "predicted MFU", "step", "compute", "memory",
                                                        "comm", "exposed comm", "why")) + "</tr></thead><tbody>")
        for plan in data["plans"]:
            p = plan.get("prediction") or {}
            layout = Layout.from_mesh(plan["layout"]).short(with_context=False)
            out.append(f"<tr><td>{_e(layout)}</td><td>{'yes' if plan.get('fits') else 'no'}</td>"
                       + _mfu_with_band(p.get("mfu"), plan.get("band"))
                       + "".join(_num_cell(p.get(key), ms(p.get(key))) for key in (
                           "step_seconds", "compute_seconds", "memory_seconds", "comm_seconds"))
                       + _exposed_comm_cell(p.get("exposed_comm_seconds"))
                       + f"<td>{_e(plan.get('why'))}</td></tr>")
        out.append("</tbody></table>")
        if any(_hidden(plan.get("prediction") or {}) for plan in data["plans"]):
            out.append(f'<p class="muted">{_e(NOT_MODELLED)}</p>')
        out.append(_figure(plots.plan(data), f"predicted MFU and step split per layout, {run}", ""))
        out.append("</section>")
        if finite(row["mfu"]) and finite(row["chips"]):
            band = next((p.get("band") for p in data["plans"] if (p.get("prediction") or {}).get("mfu") == row["mfu"]
                         and p.get("fits")), None)
            points.append({"model": row["model"], "chips": row["chips"], "mfu": row["mfu"], "topology": row["topology"],
                           "band_points": (band or {}).get("points")})
    scaling = plots.plan_scaling(pd.DataFrame(points))
    if scaling:
        out.insert(0, _figure(scaling, "best predicted MFU against slice size", ""))
    return "".join(out)


# The planner's step hides communication under busy time with a fixed overlap (planner/predict.py)
# and the adopted calibration keeps no never-hidden share, so "0 exposed" is the model's assumption.
NOT_MODELLED = ("Exposed comm \"–\": the prediction hides these collectives (comm) entirely under the compute and memory "
                "time (a fixed overlap; the calibration adopts no share that stays exposed), so none is predicted: "
                "not modelled, not a measured zero (docs/planner.md, \"Calibration\").")


def _hidden(prediction: dict[str, Any]) -> bool:
    """A prediction whose collectives are all hidden by the model (exposed comm 0 or absent)."""
    return bool(prediction) and not (prediction.get("exposed_comm_seconds") or 0.0)


def _exposed_comm_cell(seconds: Any) -> str:
    if seconds is None or (finite(seconds) and seconds > 0):
        return _num_cell(seconds, ms(seconds))
    return '<td class="num" data-v="" title="not modelled: see the note under the table">–</td>'


def _mfu_with_band(mfu: Any, band: dict[str, Any] | None) -> str:
    """Predicted MFU with its error band as the CLI prints it ("60.0% ± 12.7 points"), the band's source on hover."""
    if not finite(mfu) or not band or not finite(band.get("points")):
        return _num_cell(mfu, _pct(mfu))
    why = "; ".join([str(band.get("source") or ""), *band.get("reasons", [])]).strip("; ")
    return (f'<td class="num" data-v="{float(mfu)!r}" title="{_e(why)}">'
            f"{_e(_pct(mfu))} ± {float(band['points']):.1f} points</td>")


# The ranking table's sortable columns: the ranking.json value each cell sorts by.
_RANKING_SORT = {0: "rank", 2: "chips", 4: "step_seconds", 5: "tokens_per_second_per_chip", 6: "mfu",
                 7: "usd_per_chip_hour", 8: "tokens_per_dollar", 9: "rank_per_chip", 10: "rank_per_dollar"}


def _rankings(collection: Collection) -> str:
    """Each ranking of several slices: its table, cells as the CLI prints them, and its bar chart."""
    if not collection.rankings:
        return ('<p class="note">No ranking of several slices (<code>tpu-tune plan MODEL --topology A,B,...</code>) '
                "in this folder.</p>")
    runs = collection.runs.set_index("run")
    out = []
    for run, data in collection.rankings.items():
        row = runs.loc[run]
        state = f" ({_e(row['reason'])})" if row["status"] != "ok" else ""
        out.append(f'<section class="ranking"><h3>{_e(row["model"])} on {len(data["topologies"])} slices{state} '
                   f'<a href="{_e(row["report"])}">{_e(run)}</a></h3>')
        out.append('<table class="sortable ranking"><thead><tr>' + "".join(
            f'<th class="sortable">{_e(h)}</th>' for h in RANKING_HEADER + ["best point, or why not"])
            + "</tr></thead><tbody>")
        for entry in data["slices"]:
            texts = ranking_cells(entry)
            tds = [_num_cell(entry.get(_RANKING_SORT[i]), text) if i in _RANKING_SORT else f"<td>{_e(text)}</td>"
                   for i, text in enumerate(texts)]
            plan = f'{_e(run)}/{_e(entry["plan_dir"])}/plan.md' if entry.get("plan_dir") else None
            best = _e(entry.get("best") or entry.get("why") or "")
            tds.append(f'<td><a href="{plan}">{best}</a></td>' if plan and entry.get("best") else f"<td>{best}</td>")
            out.append(f'<tr class="{"fits" if entry.get("fits") else "nofit"}">' + "".join(tds) + "</tr>")
        out.append("</tbody></table>")
        out += [f'<p class="note">{_e(line)}</p>' for line in ranking_notes(data) if line]
        priced = {g: p for g, p in (data.get("prices") or {}).items()
                  if any(e.get("generation") == g for e in data["slices"])}
        out += [f'<p class="muted">price {_e(g)}: ${p["usd_per_chip_hour"]:.2f} per chip-hour, '
                + ("given with --price" if p["source"] == "--price" else
                   f'<a href="{_e(p["source"])}">{_e(p["source"])}</a> (read {_e(p["read"])})') + "</p>"
                for g, p in priced.items()]
        out.append(_figure(plots.ranking(data), f"tokens per dollar and tokens/s per chip with their bands, {run}",
                           "No slice fits: nothing to chart."))
        out.append("</section>")
    return "".join(out)


def _buckets(collection: Collection) -> str:
    if not collection.buckets:
        return '<p class="note">No bucketing result (<code>tpu-tune buckets</code>) in this folder.</p>'
    runs = collection.runs.set_index("run")
    out = []
    for run, data in collection.buckets.items():
        chosen = data.get("chosen") or {}
        waste = chosen.get("padding_waste")
        out.append(f'<section class="buckets"><h3>{_e(data["workload"])} <a href="{_e(runs.loc[run, "report"])}">'
                   f'{_e(run)}</a></h3><p>chosen bounds {_e(", ".join(map(str, data["chosen_buckets"])))}'
                   + (f"; padding waste {waste:.1%}" if finite(waste) else "") + "</p>"
                   + _figure(plots.buckets(data), f"length histogram and chosen buckets, {run}", "") + "</section>")
    return "".join(out)


def render_page(collection: Collection, details: int = DEFAULT_DETAILS, refresh_s: int | None = None) -> str:
    """The whole page as one HTML string. `refresh_s`: reload period while runs are live (served only)."""
    runs = collection.runs
    unreadable = runs[runs["status"] == "unreadable"] if len(runs) else runs
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = ["<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
             '<meta name="viewport" content="width=device-width, initial-scale=1">']
    if refresh_s:
        parts.append(f'<meta http-equiv="refresh" content="{int(refresh_s)}">')
    parts.append(f"<title>tpu-tune dashboard: {_e(collection.root.name)}</title><style>{_CSS}</style></head><body>")
    parts.append(f"<h1>tpu-tune dashboard</h1><p class=muted>{_e(collection.root)}: {len(runs)} run folders, "
                 f"generated {generated}</p>")
    parts += [f'<p class="note missing">{_e(note)}</p>' for note in collection.missing()]
    live = runs[runs["status"] == "running"] if len(runs) else runs
    if len(live):
        parts.append(f'<p class="note live">Still running: {_e(", ".join(live["run"]))}'
                     + (f" (this page reloads every {refresh_s} s)" if refresh_s else "") + "</p>")
    if len(unreadable):
        parts.append('<h2>Unreadable run folders</h2><ul id="unreadable">')
        parts += [f'<li class="bad"><b>{_e(r["run"])}</b>: {_e(r["reason"])}</li>' for _, r in unreadable.iterrows()]
        parts.append("</ul>")
    parts.append("<h2>Runs</h2>" + _runs_table(runs))
    parts.append('<h2>MFU</h2><div class="figs">'
                 + _figure(plots.mfu_over_time(runs), "MFU over time per model and device", "No MFU measured yet.")
                 + _figure(plots.mfu_per_model(runs), "best MFU per model against the device peak", "")
                 + _figure(plots.roofline(runs), "roofline: achieved FLOP/s against arithmetic intensity "
                           "(a tuning run contributes its baseline profile)",
                           "No profile with arithmetic intensity and peaks for a roofline.") + "</div>")
    parts.append("<h2>Tuning runs</h2>" + _details(collection, details))
    parts.append("<h2>Which TPU to rent</h2>" + _rankings(collection))
    parts.append("<h2>Plans</h2>" + _plans(collection))
    parts.append("<h2>Buckets</h2>" + _buckets(collection))
    parts.append(f"<script>{_JS}</script></body></html>")
    return "".join(parts)


def write_dashboard(root: str | Path, out: str | Path | None = None, details: int = DEFAULT_DETAILS,
                    collection: Collection | None = None) -> Path:
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
