"""Which TPU to rent: plan one model on several slices into one ranking folder, and the ranking's
files (ranking.json, ranking.md) and terminal table.

The folder layout (docs/planner.md, "Which TPU to rent"):

    results/<model>[_<preset>]-plan-ranking-<timestamp>/
        ranking.json, ranking.md          the ranking (rewritten after each slice is planned)
        <model>-plan-<topology>-<timestamp>/   one plan folder per slice, as `tpu-tune plan` writes it

The per-slice figures are read back from each plan folder's plan.json, so the ranking's figures are
the plan files' own (planner/plans/ranking.py divides them). Cells are formatted here once, for the
terminal, ranking.md and the dashboard alike, from ranking.json's plain dicts.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpu_tuner.core import run_folder
from tpu_tuner.core.run_folder import write_atomic
from tpu_tuner.core.units import duration, si
from tpu_tuner.planner.plans.ranking import RANKING_JSON, RANKING_MD, Ranking

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

HEADER = [
    "#",
    "topology",
    "chips",
    "fits",
    "step",
    "tokens/s per chip",
    "MFU",
    "$/chip-hour",
    "tokens per $",
    "# per chip",
    "# per $",
]


def write_ranking(folder: Path, ranking: Ranking) -> list[str]:
    """ranking.json and ranking.md in `folder`, each written whole (a reader never sees half)."""
    data = ranking.to_dict()
    write_atomic(folder / RANKING_JSON, json.dumps(data, indent=2, default=str))
    write_atomic(folder / RANKING_MD, render_markdown(data))
    return [RANKING_JSON, RANKING_MD]


def cells(entry: dict[str, Any]) -> list[str]:
    """One ranked slice (a ranking.json entry) as the table's cells, bands as the plan prints them."""
    fits = entry.get("fits")
    mfu, points = entry.get("mfu"), entry.get("mfu_band_points")
    price = entry.get("usd_per_chip_hour")
    return [
        str(entry.get("rank", "")),
        str(entry["topology"]),
        str(entry["chips"]),
        "yes" if fits else "NO",
        duration(entry.get("step_seconds")) if fits else "–",
        _with_band(entry, "tokens_per_second_per_chip") if fits else "–",
        (f"{mfu:.1%}" + (f" ± {points:.1f}" if points else "")) if fits and mfu is not None else "–",
        "no price"
        if price is None
        else f"${price:.2f}" + (" (--price)" if entry.get("price_source") == "--price" else ""),
        ("no price" if price is None else _with_band(entry, "tokens_per_dollar")) if fits else "–",
        str(entry.get("rank_per_chip") or "–"),
        str(entry.get("rank_per_dollar") or "–"),
    ]


def render_terminal(data: dict[str, Any], folder: str = "RANKING_DIR") -> str:
    """The ranked table, why each slice that does not fit does not, and the prices' sources."""
    rows = [HEADER] + [cells(entry) for entry in data["slices"]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = [
        f"{data['workload'] or data['source']}{' (' + data['preset'] + ')' if data.get('preset') else ''}: "
        f"{len(data['slices'])} slices ranked by tokens per dollar, then tokens/s per chip",
        "",
    ]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines += notes(data) + price_lines(data)
    lines.append(f"\nwrote {folder}/ ({RANKING_JSON}, {RANKING_MD}, and one plan folder per slice)")
    return "\n".join(lines)


def render_markdown(data: dict[str, Any]) -> str:
    """ranking.md: the table with each slice's best point, batch and plan folder, and the definitions."""
    name = data["workload"] or data["source"]
    out = [
        f"# Which TPU to rent: `{name}`{' preset ' + data['preset'] if data.get('preset') else ''}",
        "",
        f"Model `{data['source']}`, planned on {len(data['slices'])} of {len(data['topologies'])} slices "
        f"({', '.join(data['topologies'])}) with the same options; {duration(data.get('seconds'))}.",
        "",
    ]
    header = HEADER + ["best point", "global batch x seq", "plan"]
    out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for entry in data["slices"]:
        plan = f"[{entry['plan_dir']}]({entry['plan_dir']}/{run_folder.PLAN_MD})" if entry.get("plan_dir") else "–"
        batch = f"{entry['global_batch']} x {entry['seq_len']}" if entry.get("global_batch") else "–"
        row = cells(entry) + [entry.get("best") or entry.get("why") or "–", batch, plan]
        out.append("| " + " | ".join(cell.replace("|", "/") for cell in row) + " |")
    out += [""] + [line for line in notes(data) + price_lines(data) if line]
    out += [
        "",
        "## How the figures are made",
        "",
        "Each slice's figures are its plan's best point (plan.json `best`: the fitting point of highest "
        "predicted MFU); the per-chip and per-dollar figures are plan.json's divided as follows:",
        "",
    ]
    out += [f"- `{key}` = `{formula}`" for key, formula in data["definitions"].items()]
    out += [
        "",
        "Tokens per dollar is tokens/s per dollar a second of the slice's on-demand price. The band "
        "(low-high in brackets) is the MFU band of the plan (± MFU points) carried to throughput, which "
        "is proportional to MFU at a fixed slice and step. Prices are on-demand list prices per chip-hour; "
        "discounts, commitments, spot prices, regions and the host VMs are not counted.",
    ]
    return "\n".join(out) + "\n"


def notes(data: dict[str, Any]) -> list[str]:
    """What the table cannot say: why a slice does not fit, slices the bands cannot order, missing
    prices, differing batches (a blank line first, for the terminal)."""
    lines: list[str | None] = [""]
    lines += [f"{e['topology']}: {e['why']}" for e in data["slices"] if not e.get("fits")]
    lines += [
        _overlap(data["slices"], key, label)
        for key, label in (("tokens_per_dollar", "tokens per $"), ("tokens_per_second_per_chip", "tokens/s per chip"))
    ]
    unpriced = sorted({e["generation"] for e in data["slices"] if e.get("usd_per_chip_hour") is None})
    if unpriced:
        lines.append(
            f"no price for {', '.join(unpriced)} (none found in a public source): per-chip figures only; "
            "give one with --price GEN=USD_PER_CHIP_HOUR"
        )
    batches = {(e.get("global_batch"), e.get("seq_len")) for e in data["slices"] if e.get("global_batch")}
    if len(batches) > 1:
        lines.append(
            "the slices planned different global batches (each its default: give --global-batch to "
            "compare the same step): "
            + ", ".join(f"{e['topology']} {e['global_batch']}" for e in data["slices"] if e.get("global_batch"))
        )
    return [line for line in lines if line is not None]


def price_lines(data: dict[str, Any]) -> list[str]:
    """The price of each generation ranked, with its source and the date it was read."""
    used = {e["generation"] for e in data["slices"]}
    return [
        f"price {generation}: ${price['usd_per_chip_hour']:.2f} per chip-hour, "
        + ("given with --price" if price["source"] == "--price" else f"{price['source']} (read {price['read']})")
        for generation, price in data["prices"].items()
        if generation in used
    ]


def _overlap(slices: list[dict[str, Any]], key: str, label: str) -> str | None:
    """Which slices' bands reach the first one's on `key`: the prediction cannot order those."""
    candidates = sorted((e for e in slices if e.get("fits") and e.get(key) is not None), key=lambda e: -e[key])
    if len(candidates) < 2:
        return None
    first = candidates[0]
    floor = first.get(f"{key}_low", first[key])
    close = [e["topology"] for e in candidates[1:] if (e.get(f"{key}_high") or e[key]) >= floor]
    if not close:
        return None
    return (
        f"by {label}, {', '.join(close)} {'is' if len(close) == 1 else 'are'} within the band of the first "
        f"({first['topology']}): the prediction cannot order them; measure them on the hardware"
    )


def _with_band(entry: dict[str, Any], key: str) -> str:
    value, low, high = entry.get(key), entry.get(f"{key}_low"), entry.get(f"{key}_high")
    if value is None:
        return "–"
    text = si(value, "").strip()
    if low is not None and high is not None and high > low:
        text += f" ({si(low, '').strip()}-{si(high, '').strip()})"
    return text


__all__ = [
    "HEADER",
    "cells",
    "notes",
    "price_lines",
    "render_markdown",
    "render_terminal",
    "write_ranking",
]
