"""plan.md, the MFU plot and the terminal table of a `PlanResult`."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from tpu_tuner.core.failures import FailureKind, is_compiler_out_of_memory
from tpu_tuner.core.units import binary_bytes, ms, si
from tpu_tuner.outputs.figure_file import save_figure
from tpu_tuner.planner.plans.plan import LayoutPlan, PlanResult
from tpu_tuner.planner.prediction.hbm_estimate import estimate_text


def hbm_status(p: LayoutPlan) -> str:
    """ "fits, margin X", "DOES NOT FIT", or "COMPILER FAILED" where the compiler refused for
    another reason than memory (`core.failures.is_compiler_out_of_memory`, as the planner decides)."""
    if p.compiled.error:
        out_of_memory = is_compiler_out_of_memory(p.compiled.error)
        effort = f" ({p.fit_effort})" if out_of_memory and p.fit_effort != "full" else ""
        return ("DOES NOT FIT" + effort) if out_of_memory else "COMPILER FAILED"
    status = (
        "DOES NOT FIT"
        if not p.fits
        else "fits (the compiler accepted its allocation over the limit)"
        if p.over_limit_accepted
        else f"fits, margin {binary_bytes(p.margin_bytes)}"
    )
    return status + (f" ({p.fit_effort})" if p.fit_effort != "full" else "")


def table_rows(result: PlanResult) -> list[list[str]]:
    rows = []
    for rank, p in enumerate(result.plans, 1):
        c, pr = p.compiled, p.prediction
        band = f" ± {p.band.points:.1f}" if p.band else ""
        collectives = (
            ", ".join(
                f"{x.kind} x{x.count} ({binary_bytes(x.bytes)}, "
                + (f"DCN across {x.group_size} slices)" if x.network == "dcn" else f"groups of {x.group_size})")
                for x in c.collectives
                if x.count and x.group_size > 1
            )
            or "none"
        )
        rows.append(
            [
                str(rank),
                point_label(p),
                hbm_status(p) + (f"; {estimate_text(p.memory_estimate)}" if p.memory_estimate else ""),
                binary_bytes(c.peak_bytes) if not c.error else "n/a",
                si(c.flops, "FLOP") if not c.error else "n/a",
                binary_bytes(c.bytes_accessed) if not c.error else "n/a",
                f"{ms(pr.compute_seconds)} / {ms(pr.memory_seconds)} / {ms(pr.comm_seconds)} "
                f"({ms(pr.exposed_comm_seconds)} exposed)"
                if pr
                else "n/a",
                ms(pr.step_seconds) if pr else "n/a",
                f"{pr.tokens_per_second:,.0f}" if pr else "n/a",
                f"{pr.mfu:.1%}{band}" if pr else "n/a",
                collectives if not c.error else p.why,
            ]
            + ([dcn_cell(p)] if result.topology.slices > 1 else [])
            + ([host_link_cell(p)] if offloads(result) else [])
        )
    return rows


def offloads(result: PlanResult) -> bool:
    """Whether any point of the plan moves tensors over the host link (a host-offload remat)."""
    return any(p.prediction and p.prediction.host_link_seconds > 0 for p in result.plans)


def host_link_cell(p: LayoutPlan) -> str:
    """A point's offloaded tensors' time on the host link, a floor under its step (predict.py's
    roofline), and whether it is what sets the step."""
    pr = p.prediction
    if pr is None or pr.host_link_seconds <= 0:
        return "none" if pr else "n/a"
    return ms(pr.host_link_seconds) + (" (sets the step)" if pr.step_seconds <= pr.host_link_seconds else "")


def dcn_cell(p: LayoutPlan) -> str:
    """A multi-slice point's DCN collectives: their ring time at the DCN bandwidth and what they add
    to the step (reported apart from the ICI communication)."""
    pr = p.prediction
    return f"{ms(pr.dcn_seconds)} ({ms(pr.exposed_dcn_seconds)} exposed)" if pr else "n/a"


DCN_HEADER = "DCN collectives (exposed)"  # a column of multi-slice plans only


HOST_LINK_HEADER = "host link (offloaded tensors)"  # a column of plans where a point offloads


def header(result: PlanResult) -> list[str]:
    """The table's columns: HEADER, DCN_HEADER for a plan over several slices, HOST_LINK_HEADER
    where a point offloads to the host."""
    return (
        HEADER + ([DCN_HEADER] if result.topology.slices > 1 else []) + ([HOST_LINK_HEADER] if offloads(result) else [])
    )


HEADER = [
    "#",
    "mesh",
    "HBM",
    "peak per device",
    "FLOPs per device",
    "HBM bytes",
    "compute / memory / comm",
    "step",
    "tokens/s",
    "MFU",
    "collectives per step",
]


def point_label(p: LayoutPlan) -> str:
    """The mesh, and where they vary, the remat policy and micro-batches (with the per-device batch)."""
    label = p.layout.name() + f", remat {p.remat}"
    if p.accumulation > 1:
        label += f", {p.accumulation} micro-batches"
    if not p.per_device_batch:
        return label
    per_chip = f"; {p.per_chip_batch:g} per chip" if p.per_chip_batch and p.per_chip_batch != p.per_device_batch else ""
    return label + f" (per-device batch {p.per_device_batch:g}{per_chip})"


def per_chip(result: PlanResult) -> str:
    """Sequences per chip a step, with how many devices share a chip (TPU7x: 2; v4: megacore)."""
    topology = result.topology
    how = (
        "one megacore device per chip"
        if topology.megacore
        else f"{topology.devices_per_chip} devices per chip"
        if topology.devices_per_chip > 1
        else "one device per chip"
    )
    return f"{result.global_batch / topology.chips:g} sequences per chip, {how}"


def verdict(result: PlanResult, model_file: str = "MODEL.py", run_dir: str = "PLAN_DIR") -> list[str]:
    """The best point with its band; where others are within the band, that they are
    indistinguishable and how to measure them."""
    best = result.best
    if best is None or best.prediction is None:  # the best always has a prediction
        return ["no point fits in HBM"]
    band = result.error_band
    lines = [
        f"best: {point_label(best)}: predicted MFU {best.prediction.mfu:.1%}"
        + (f" ± {band.points:.1f} points ({band.source})" if band else "")
    ]
    lines += [f"  {reason}" for reason in (band.reasons if band else ())]
    close = result.indistinguishable
    if len(close) > 1 and band is not None:  # points are indistinguishable only within a band
        lines += [
            f"{len(close)} points are within {band.points:.1f} MFU points of it, so the prediction cannot order "
            "them: " + "; ".join(point_label(p) for p in close[1:4]) + (" ..." if len(close) > 4 else ""),
            f"measure them on the hardware: tpu-tune {model_file} --nproc N --plan {run_dir}",
        ]
    return lines


def precision(result: PlanResult) -> str:
    """The step's precision and what MFU is measured against (MaxText's tables: the bf16 peak)."""
    weights = "bf16" if result.weight_dtype == "bfloat16" else "fp32"
    matmuls = (
        f"the decoder blocks' matmuls run in {result.quantization} (forward and backward; the logits matmul "
        f"in bf16), at the {result.quantization} peak"
        if result.quantization
        else "bf16 matmuls"
    )
    # AdamW, the default, goes unsaid: earlier reports read as they did.
    optimizer = ", SGD without momentum (no optimizer state)" if result.optimizer == "sgd" else ""
    return f"{weights} master weights, {matmuls}{optimizer}; MFU against the bf16 peak (MaxText's convention)"


def render_terminal(result: PlanResult, model_file: str = "MODEL.py", run_dir: str = "PLAN_DIR") -> str:
    lines = [
        f"{result.workload}{' (' + result.preset + ')' if result.preset else ''} on {result.topology.describe()}",
        f"global batch {result.global_batch} x seq {result.seq_len} ({per_chip(result)}), remat {result.remat}; "
        f"model FLOPs {si(result.model_flops_per_step, 'FLOP')} per step ({result.attention_convention})",
        f"precision: {precision(result)}",
    ]
    if result.search:
        search = result.search
        counts: dict[str, int] = {}
        for trial in search["trials"]:
            kind = trial["outcome"] or {"WAITING": "queued", "RUNNING": "running"}.get(trial["state"], FailureKind.LOST)
            counts[kind] = counts.get(kind, 0) + 1
        lines.append(
            f"search: {search['sampler']}, {search['compiled']} compiles of {search['valid_points']} valid "
            f"points; trials: "
            + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
            + f"; study {search['study']!r} in {search['storage']}"
        )
    lines.append("")
    short = [0, 1, 2, 3, 7, 8, 9] + ([len(HEADER)] if result.topology.slices > 1 else [])
    short += [len(header(result)) - 1] if offloads(result) else []  # the host link's column, last
    shown = table_rows(result)[:TERMINAL_ROWS]
    rows = [[header(result)[i] for i in short]] + [[r[i] for i in short] for r in shown]
    widths = [max(len(r[i]) for r in rows) for i in range(len(short))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
    if len(result.plans) > TERMINAL_ROWS:
        lines.append(f"... {len(result.plans) - TERMINAL_ROWS} more in plan.md")
    lines += [""] + verdict(result, model_file, run_dir)
    return "\n".join(lines)


TERMINAL_ROWS = 15


def render_markdown(result: PlanResult, plot: Path, model_file: str = "MODEL.py", run_dir: str = "PLAN_DIR") -> str:
    out = [
        f"# Plan: `{result.workload}`{' preset ' + result.preset if result.preset else ''} on {result.topology.name}",
        "",
        f"{result.topology.describe()}; HBM {binary_bytes(result.topology.hbm_bytes_per_device)} and bf16 peak "
        f"{si(result.topology.peak_flops_per_device, 'FLOP/s')} per device.",
        "",
        f"Global batch {result.global_batch} sequences of {result.seq_len} tokens ({per_chip(result)}); "
        f"remat `{result.remat}`; {result.matmul_parameters:,} matmul parameters; "
        f"model FLOPs {si(result.model_flops_per_step, 'FLOP')} per step ({result.attention_convention}).",
        "",
        f"Precision: {precision(result)}.",
        "",
        f"Method: {result.method}. Memory, FLOPs, HBM bytes and collectives are the TPU compiler's (libtpu, "
        "compile-only); step time and MFU are predictions (see docs/planner.md).",
        "",
        "| " + " | ".join(header(result)) + " |",
        "|" + "---|" * len(header(result)),
    ]
    out += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in table_rows(result)]
    out += [""] + [f"**{line}**" if i == 0 else line for i, line in enumerate(verdict(result, model_file, run_dir))]
    if result.error_band:
        out += [
            "",
            f"Error band of the best: ± {result.error_band.points:.1f} MFU points, the {result.error_band.source}"
            + "".join(f"; {r}" for r in result.error_band.reasons)
            + ".",
        ]
    out += ["", "## Memory per point", ""] + [
        f"- {point_label(p)}: {hbm_status(p).split(',')[0].lower()}: {p.why}"
        f" (lower bound {binary_bytes(p.lower_bound_bytes)})"
        for p in result.plans
    ]
    if result.search:
        out += [
            "",
            f"## Search: every trial ({len(result.search['trials'])})",
            "",
            "| trial | outcome | point | tokens/s | why |",
            "|---|---|---|---|---|",
        ]
        out += [
            f"| {t['number']} | {t['outcome'] or t['state'].lower()} | {t['point'] or t['params']} | "
            f"{'' if t['tokens_per_second'] is None else format(t['tokens_per_second'], ',.0f')} | "
            f"{(t['reason'] or '').replace('|', '/')} |"
            for t in result.search["trials"]
        ]
    if result.rejected:
        out += ["", f"## Rejected layouts ({len(result.rejected)})", ""] + [
            f"- {layout.name()}: {why}" for layout, why in result.rejected[:30]
        ]
    out += [
        "",
        "## Placements (per parameter: mesh axis of dimension 0 / dimension 1)",
        "",
        "```",
        json.dumps(result.placements, indent=1)[:6000],
        "```",
        "",
        f"![predicted MFU per layout]({plot.name})",
        "",
        f"Planned in {result.seconds:.0f} s.",
    ]
    return "\n".join(out) + "\n"


def write_plot(result: PlanResult, path: Path) -> Path:
    labels = [point_label(p).replace(" x ", "\n").replace(", ", "\n") for p in result.plans[:40]]
    mfu = [p.prediction.mfu * 100 if p.prediction else 0 for p in result.plans[:40]]
    colors = ["tab:blue" if p.fits else "tab:gray" if p.compiled.error else "tab:red" for p in result.plans[:40]]
    fig, ax = plt.subplots(figsize=(max(6, len(labels) * 0.9), 4))
    bands = [p.band.points if p.band else 0.0 for p in result.plans[:40]]
    ax.bar(range(len(labels)), mfu, color=colors, yerr=[b if m else 0 for b, m in zip(bands, mfu)], capsize=3)
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylabel("predicted MFU, %")
    ax.set_title(f"{result.workload} on {result.topology.name} (red: does not fit in HBM; grey: compiler failed)")
    return save_figure(fig, path, dpi=100)
