"""The page's planner sections: each plan (its predictions with their bands), each ranking of
slices, each bucketing result; cells as the CLI prints them."""

from __future__ import annotations

from typing import Any

import pandas as pd

import tpu_tuner.dashboard.plots as plots
from tpu_tuner.core.units import ms
from tpu_tuner.dashboard.collection import Collection
from tpu_tuner.dashboard.device_labels import device_label, kind_of
from tpu_tuner.dashboard.folder_files import finite
from tpu_tuner.dashboard.html_cells import esc, figure_html, num_cell, pct, sortable_table
from tpu_tuner.model.meshes.layouts import Layout
from tpu_tuner.outputs.ranking_report import HEADER as RANKING_HEADER
from tpu_tuner.outputs.ranking_report import cells as ranking_cells
from tpu_tuner.outputs.ranking_report import notes as ranking_notes


def plans_section(collection: Collection) -> str:
    """Each plan: its points' predictions (MFU with its band) and plots; best MFU against slice size."""
    if not collection.plans:
        return '<p class="note">No planner result (<code>tpu-tune plan</code>) in this folder.</p>'
    out, points = [], []
    runs = collection.runs.set_index("run")
    for run, data in collection.plans.items():
        row = runs.loc[run]
        out += [
            f'<section class="plan"><h3>{esc(row["model"])} on {esc(row["topology"])} '
            f"({esc(int(row['chips']) if finite(row['chips']) else '?')} chips) "
            f'<a href="{esc(row["report"])}">{esc(run)}</a></h3>',
            sortable_table(
                ("layout", "fits", "predicted MFU", "step", "compute", "memory", "comm", "exposed comm", "why")
            ),
        ]
        for plan in data["plans"]:
            p = plan.get("prediction") or {}
            layout = Layout.from_mesh(plan["layout"]).short(with_context=False)
            out.append(
                f"<tr><td>{esc(layout)}</td><td>{'yes' if plan.get('fits') else 'no'}</td>"
                + mfu_with_band(p.get("mfu"), plan.get("band"))
                + "".join(
                    num_cell(p.get(key), ms(p.get(key)))
                    for key in ("step_seconds", "compute_seconds", "memory_seconds", "comm_seconds")
                )
                + exposed_comm_cell(p.get("exposed_comm_seconds"))
                + f"<td>{esc(plan.get('why'))}</td></tr>"
            )
        out.append("</tbody></table>")
        if any(hidden_comm(plan.get("prediction") or {}) for plan in data["plans"]):
            out.append(f'<p class="muted">{esc(NOT_MODELLED)}</p>')
        out += [figure_html(plots.plan(data), f"predicted MFU and step split per layout, {run}", ""), "</section>"]
        if finite(row["mfu"]) and finite(row["chips"]):
            band = next(
                (
                    p.get("band")
                    for p in data["plans"]
                    if (p.get("prediction") or {}).get("mfu") == row["mfu"] and p.get("fits")
                ),
                None,
            )
            points.append(
                {
                    "model": row["model"],
                    "chips": row["chips"],
                    "mfu": row["mfu"],
                    "topology": row["topology"],
                    "band_points": (band or {}).get("points"),
                }
            )
    scaling = plots.plan_scaling(pd.DataFrame(points))
    if scaling:
        out.insert(0, figure_html(scaling, "best predicted MFU against slice size", ""))
    return "".join(out)


# The planner's step hides communication under busy time with a fixed overlap (planner/prediction/predict.py)
# and the adopted calibration keeps no never-hidden share, so "0 exposed" is the model's assumption.
NOT_MODELLED = (
    'Exposed comm "–": the prediction hides these collectives (comm) entirely under the compute and memory '
    "time (a fixed overlap; the calibration adopts no share that stays exposed), so none is predicted: "
    'not modelled, not a measured zero (docs/planner.md, "Calibration").'
)


def hidden_comm(prediction: dict[str, Any]) -> bool:
    """A prediction whose collectives are all hidden by the model (exposed comm 0 or absent)."""
    return bool(prediction) and not (prediction.get("exposed_comm_seconds") or 0.0)


def exposed_comm_cell(seconds: Any) -> str:
    """Exposed communication: its time, "n/a" without a prediction, "–" where the model hides it all."""
    if seconds is None or (finite(seconds) and seconds > 0):
        return num_cell(seconds, ms(seconds))
    return '<td class="num" data-v="" title="not modelled: see the note under the table">–</td>'


def mfu_with_band(mfu: Any, band: dict[str, Any] | None) -> str:
    """Predicted MFU with its error band as the CLI prints it ("60.0% ± 12.7 points"), the band's source on hover."""
    if not finite(mfu) or not band or not finite(band.get("points")):
        return num_cell(mfu, pct(mfu))
    why = "; ".join([str(band.get("source") or ""), *band.get("reasons", [])]).strip("; ")
    return (
        f'<td class="num" data-v="{float(mfu)!r}" title="{esc(why)}">'
        f"{esc(pct(mfu))} ± {float(band['points']):.1f} points</td>"
    )


# The ranking table's sortable columns: the ranking.json value each cell sorts by.
_RANKING_SORT = {
    0: "rank",
    2: "chips",
    4: "step_seconds",
    5: "tokens_per_second_per_chip",
    6: "mfu",
    7: "usd_per_chip_hour",
    8: "tokens_per_dollar",
    9: "rank_per_chip",
    10: "rank_per_dollar",
}


def rankings_section(collection: Collection) -> str:
    """Each ranking of several slices: its table, cells as the CLI prints them, and its bar chart."""
    if not collection.rankings:
        return (
            '<p class="note">No ranking of several slices (<code>tpu-tune plan MODEL --topology A,B,...</code>) '
            "in this folder.</p>"
        )
    runs = collection.runs.set_index("run")
    out = []
    for run, data in collection.rankings.items():
        row = runs.loc[run]
        state = f" ({esc(row['reason'])})" if row["status"] != "ok" else ""
        out += [
            f'<section class="ranking"><h3>{esc(row["model"])} on {len(data["topologies"])} slices{state} '
            f'<a href="{esc(row["report"])}">{esc(run)}</a></h3>',
            sortable_table(RANKING_HEADER + ["best point, or why not"], 'class="sortable ranking"'),
        ]
        for entry in data["slices"]:
            texts = ranking_cells(entry)
            tds = [
                num_cell(entry.get(_RANKING_SORT[i]), text) if i in _RANKING_SORT else f"<td>{esc(text)}</td>"
                for i, text in enumerate(texts)
            ]
            plan = f"{esc(run)}/{esc(entry['plan_dir'])}/plan.md" if entry.get("plan_dir") else None
            best = esc(entry.get("best") or entry.get("why") or "")
            tds.append(f'<td><a href="{plan}">{best}</a></td>' if plan and entry.get("best") else f"<td>{best}</td>")
            out.append(f'<tr class="{"fits" if entry.get("fits") else "nofit"}">' + "".join(tds) + "</tr>")
        out.append("</tbody></table>")
        out += [f'<p class="note">{esc(line)}</p>' for line in ranking_notes(data) if line]
        priced = {
            g: p for g, p in (data.get("prices") or {}).items() if any(e.get("generation") == g for e in data["slices"])
        }
        out += [
            f'<p class="muted">price {esc(g)}: ${p["usd_per_chip_hour"]:.2f} per chip-hour, '
            + (
                "given with --price"
                if p["source"] == "--price"
                else f'<a href="{esc(p["source"])}">{esc(p["source"])}</a> (read {esc(p["read"])})'
            )
            + "</p>"
            for g, p in priced.items()
        ]
        out.append(
            figure_html(
                plots.ranking(data),
                f"tokens per dollar and tokens/s per chip with their bands, {run}",
                "No slice fits: nothing to chart.",
            )
        )
        out.append("</section>")
    return "".join(out)


def buckets_section(collection: Collection) -> str:
    """Each bucketing result: the chosen bounds, padding waste and the length histogram."""
    if not collection.buckets:
        return '<p class="note">No bucketing result (<code>tpu-tune buckets</code>) in this folder.</p>'
    runs = collection.runs.set_index("run")
    out = []
    for run, data in collection.buckets.items():
        chosen = data.get("chosen") or {}
        waste = chosen.get("padding_waste")
        device = device_label(runs.loc[run, "device"], runs.loc[run, "device_name"])
        out.append(
            f'<section class="buckets" data-device-kind="{esc(kind_of(runs.loc[run, "device"]))}">'
            f'<h3>{esc(data["workload"])} on {esc(device)} <a href="{esc(runs.loc[run, "report"])}">'
            f"{esc(run)}</a></h3><p>chosen bounds {esc(', '.join(map(str, data['chosen_buckets'])))}"
            + (f"; padding waste {waste:.1%}" if finite(waste) else "")
            + "</p>"
            + _measured_costs(data)
            + figure_html(plots.buckets(data), f"length histogram and chosen buckets, {run}", "")
            + "</section>"
        )
    return "".join(out)


def _measured_costs(data: dict[str, Any]) -> str:
    """What the study measured on its device: compile seconds per new shape with the backend's
    counters, and what the chosen buckets pay in padding against compiles ('' for a result
    written before these were kept)."""
    shapes = (data.get("cost_model") or {}).get("shapes") or []
    chosen = data.get("chosen") or {}
    if not shapes or not finite(chosen.get("padding_seconds")):
        return ""
    device = data.get("device_name") or data.get("device") or "the device"
    seconds = [float(s["compile_seconds"]) for s in shapes]
    counted = [s for s in shapes if s.get("counter")]
    counts = (
        f" ({sum(1 for s in counted if s.get('compilations'))} compiled, "
        f"{sum(1 for s in counted if s.get('compilations') == 0 and s.get('cache_hits'))} cache hits by "
        f"{esc(counted[0]['counter'])})"
        if counted
        else " (no compile counter)"
    )
    return (
        f'<p class="note">measured on {esc(device)}: {len(shapes)} new shapes, '
        f"{min(seconds):.2f}-{max(seconds):.2f} s compile each{counts}; over {data.get('steps')} steps the chosen "
        f"buckets pay {chosen['padding_seconds']:,.1f} s of padding against {chosen['compile_seconds']:,.1f} s "
        "of compiles</p>"
    )
