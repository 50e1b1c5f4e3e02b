"""The bucketing study as a terminal table, a markdown report and two plots."""

from __future__ import annotations

from pathlib import Path

from tpu_tuner.bucketing.heldout import POWERS_OF_TWO, HeldOut
from tpu_tuner.bucketing.study import BucketResult, Replay
from tpu_tuner.core.run_folder import LENGTHS_PNG, STRATEGIES_PNG
from tpu_tuner.outputs.figure_file import save_figure


def _row(result: BucketResult, name: str) -> dict[str, object]:
    evaluation = next(e for e in result.table if e.strategy.name == name)
    # With held-out lengths the replays ran on them: they belong to the held-out table.
    replay = None if result.heldout else next((r for r in result.replays if r.strategy == name), None)
    return {
        "strategy": name,
        "shapes": evaluation.compiled_shapes,
        "padding": f"{evaluation.padding_waste:.1%}",
        "compile s": _seconds(evaluation.compile_seconds),
        "steps s": _seconds(evaluation.step_seconds),
        "predicted total s": _seconds(evaluation.total_seconds) + ("" if evaluation.within_limits else " *"),
        "measured total s": _seconds(replay.total_seconds) if replay else "-",
        "vs oracle": f"{evaluation.total_seconds / result.oracle_seconds:.2f}x",
    }


def table_rows(result: BucketResult) -> list[dict[str, object]]:
    rows = [_row(result, e.strategy.name) for e in result.table]
    rows.append(
        {
            "strategy": "oracle bound (free compiles, no padding)",
            "shapes": "-",
            "padding": "0.0%",
            "compile s": "0",
            "steps s": _seconds(result.oracle_seconds),
            "predicted total s": _seconds(result.oracle_seconds),
            "measured total s": "-",
            "vs oracle": "1.00x",
        }
    )
    return rows


def heldout_rows(heldout: HeldOut, replays: list[Replay]) -> list[dict[str, object]]:
    """The held-out table: each strategy's predicted (and, where replayed, measured) total and
    its ratio to powers of two on the same held-out lengths, compiles included."""
    measured = {r.strategy: r.total_seconds for r in replays}
    base = next((e for e in heldout.table if e.strategy.name == POWERS_OF_TWO), None)
    rows = []
    base_replayed = measured.get(POWERS_OF_TWO)
    for e in heldout.table:
        replayed = measured.get(e.strategy.name)
        rows.append(
            {
                "strategy (held-out)": e.strategy.name,
                "shapes": e.compiled_shapes,
                "padding": f"{e.padding_waste:.1%}",
                "predicted total s": _seconds(e.total_seconds),
                "vs powers of two": f"{e.total_seconds / base.total_seconds:.3f}x" if base else "-",
                "measured total s": _seconds(replayed) if replayed is not None else "-",
                "measured vs powers of two": f"{replayed / base_replayed:.3f}x" if replayed and base_replayed else "-",
            }
        )
    return rows


def _heldout_head(result: BucketResult) -> str:
    h = result.heldout
    assert h is not None
    added = (
        f"; {len(h.added_bounds)} bound(s) added for lengths past the chosen: {h.added_bounds}"
        if h.added_bounds
        else ""
    )
    return (
        f"held-out lengths {h.source}: {h.samples} lengths, {h.distinct_lengths} distinct, not used to choose the "
        f"buckets; the other strategies are made from them{added}"
    )


def _aligned(rows: list[dict[str, object]]) -> list[str]:
    headers = list(rows[0])
    widths = [max(len(h), *(len(str(r[h])) for r in rows)) for h in headers]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    return lines + ["  ".join(str(r[h]).ljust(w) for h, w in zip(headers, widths, strict=True)) for r in rows]


def render_terminal(result: BucketResult) -> str:
    """The study as the terminal prints it: the sample, the cost model, the strategies' table(s)."""
    lines = [
        f"{result.workload} on {result.device} (torch.compile backend {result.compile_backend!r}, static shapes): "
        f"{result.samples} lengths, {result.distinct_lengths} distinct, median {result.length_summary['median']:.0f}, "
        f"max {result.length_summary['max']}",
        f"cost model: {result.cost_model.describe()}",
        f"planned run: {result.steps} steps; at most {result.max_buckets} buckets, multiples of {result.align}",
        *_aligned(table_rows(result)),
    ]
    if any(not e.within_limits for e in result.table):
        lines.append(f"* compiles more shapes than --max-buckets {result.max_buckets}")
    if result.heldout is not None:
        lines += ["", _heldout_head(result), *_aligned(heldout_rows(result.heldout, result.replays))]
    if result.replay_note:
        lines.append(f"measured: {result.replay_note}")
    lines.append(
        f"chosen buckets: {list(result.chosen.strategy.bounds)} (optimiser {result.optimiser_seconds * 1e3:.1f} ms)"
    )
    return "\n".join(lines)


def render_markdown(result: BucketResult, plots: list[str]) -> str:
    rows = table_rows(result)
    headers = list(rows[0])
    chosen = result.chosen
    lines = [
        f"# Shape buckets for {result.workload}",
        "",
        f"**Chosen buckets:** `{list(chosen.strategy.bounds)}`: {chosen.compiled_shapes} compiled shapes, "
        f"{chosen.padding_waste:.1%} of processed tokens are padding, predicted {chosen.total_seconds:,.0f} s for "
        f"{result.steps} steps ({chosen.total_seconds / result.oracle_seconds:.2f}x the oracle bound).",
        "",
        "## Length sample",
        f"{result.samples} lengths, {result.distinct_lengths} distinct; "
        + ", ".join(f"{k} {v:g}" for k, v in result.length_summary.items()),
        "",
        "## Cost model (measured on this device)",
        f"- device {result.device}, `torch.compile(backend={result.compile_backend!r}, dynamic=False)`",
        f"- {result.cost_model.describe()}",
        "- measured points (length: steady step s, compile s): "
        + "; ".join(
            f"{length}: {step:.4f}, {comp:.2f}"
            for (length, step), (_, comp) in zip(
                result.cost_model.fit_points, result.cost_model.compile_samples, strict=True
            )
        ),
        "- expected total = compiled shapes x compile cost + steps x mean step time at the padded length",
        "",
        "## Strategies",
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
    ]
    lines += ["| " + " | ".join(str(r[h]) for h in headers) + " |" for r in rows]
    if any(not e.within_limits for e in result.table):
        lines.append(f"\n\\* compiles more shapes than the limit of {result.max_buckets}.")
    if result.heldout is not None:
        held = heldout_rows(result.heldout, result.replays)
        lines += ["", "## Held-out lengths", "", _heldout_head(result) + ".", ""]
        lines += ["| " + " | ".join(held[0]) + " |", "|" + "---|" * len(held[0])]
        lines += ["| " + " | ".join(str(v) for v in r.values()) + " |" for r in held]
    if result.replay_note:
        lines += ["", f"Measured totals: {result.replay_note}."]
    lines += ["", "Bounds per strategy:", ""]
    lines += [f"- {e.strategy.name}: {_short(e.strategy.bounds)} ({e.strategy.note})" for e in result.table]
    lines += [
        "",
        *[f"![{p}]({p})" for p in plots],
        "",
        "Reproduce: pad each batch with `tpu_tuner.bucketing.pad_to_bucket(sequences, BUCKETS)`; "
        "see bucket_config.toml.",
    ]
    return "\n".join(lines) + "\n"


def write_plots(result: BucketResult, run_dir: Path) -> list[str]:
    """length_histogram.png (with the chosen bounds) and strategy_totals.png; returns file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(result.histogram.lengths, result.histogram.counts, width=1.0, color="#4477aa")
    for bound in result.chosen.strategy.bounds:
        ax.axvline(bound, color="#cc3311", linewidth=1)
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("samples")
    ax.set_title(f"{result.workload}: lengths and chosen bucket bounds (red)")
    save_figure(fig, run_dir / LENGTHS_PNG, dpi=110)

    fig, ax = plt.subplots(figsize=(8, 4))
    names = [e.strategy.name for e in result.table] + ["oracle bound"]
    compile_s = [e.compile_seconds for e in result.table] + [0.0]
    steps_s = [e.step_seconds for e in result.table] + [result.oracle_seconds]
    positions = range(len(names))
    ax.barh(positions, steps_s, color="#4477aa", label="steps (predicted)")
    ax.barh(positions, compile_s, left=steps_s, color="#ee7733", label="compiles (predicted)")
    measured = {} if result.heldout else {r.strategy: r.total_seconds for r in result.replays}
    points = [(measured[name], index) for index, name in enumerate(names) if name in measured]
    if points:
        ax.plot([x for x, _ in points], [y for _, y in points], "kD", linestyle="none", label="measured total")
    ax.set_yticks(list(positions), names)
    ax.set_xscale("log")
    ax.set_xlabel(f"seconds for {result.steps} steps (log scale)")
    ax.legend(loc="lower right")
    save_figure(fig, run_dir / STRATEGIES_PNG, dpi=110)
    return [LENGTHS_PNG, STRATEGIES_PNG]


def _seconds(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 1 else f"{value:.3g}"


def _short(bounds: tuple[int, ...]) -> str:
    return (
        str(list(bounds))
        if len(bounds) <= 12
        else f"[{', '.join(map(str, bounds[:6]))}, ... {bounds[-1]}] ({len(bounds)} bounds)"
    )
