"""profile.md and the terminal summary of a `Profile`."""

from __future__ import annotations

from tpu_tuner.core.units import binary_bytes, ms, si
from tpu_tuner.metrics.mfu import mfu_text
from tpu_tuner.profiling.profile import Profile


def summary_rows(p: Profile) -> list[tuple[str, str]]:
    """The headline figures, shared by the terminal table and the Markdown report."""
    t = p.timing
    device = p.device
    compiles = ", ".join(f"{k} {v}" for k, v in p.warmup.compiles.items()) or "none"
    return [
        (
            "workload",
            f"{p.workload.name} ({', '.join(filter(None, (p.workload.step, p.workload.sizes())))}, "
            f"{p.workload.convention} convention)",
        ),
        ("device", f"{device.name} ({device.kind}, {device.count} device{'s' if device.count != 1 else ''})"),
        ("run settings", p.candidate.describe()),
        (
            "peak for MFU",
            f"{si(p.peak_flops_per_s, 'FLOP/s')} {p.peak_dtype} per device (the fastest dtype); {device.peak.source}",
        ),
        (
            "step time",
            f"median {ms(t.median)}, p10 {ms(t.p10)}, p90 {ms(t.p90)} over {t.count} samples timed to their result "
            f"(CV {t.cv:.1%}, robust CV {t.robust_cv:.1%})",
        ),
        (
            "first call",
            f"{ms(p.warmup.first_call_seconds)} (compile + warm-up; {p.warmup.steps} warm-up steps, "
            f"compilations: {compiles})",
        ),
        (
            "FLOPs per step",
            f"counted {si(p.flops.counted_per_step, 'FLOP')}; model {si(p.flops.model_per_step, 'FLOP')}",
        ),
        ("model FLOPs formula", p.flops.model_formula),
        ("attention convention", p.flops.attention_convention),
        ("achieved", si(p.achieved_flops_per_s, "FLOP/s") + " of model FLOPs"),
        (
            "MFU",
            f"{'at least ' if p.mfu_is_lower_bound else ''}{mfu_text(p.mfu)} of the {p.peak_dtype} peak; "
            f"per dtype: {_per_dtype(p)}",
        ),
        *([("measured probe", _probe_line(p))] if p.device.probe is not None else []),
        *_flops_rows(p),
        ("peak memory", f"{binary_bytes(p.memory.peak_bytes)} ({p.memory.method})"),
        ("peak memory estimated", _estimate_line(p)),
        *([("device busy", _busy_line(p))] if p.device_busy_method is not None else []),
        ("verdict", p.verdict.summary),
    ]


def _busy_line(p: Profile) -> str:
    """The device's measured busy time per step and its share of the step, with how it was
    measured; or why it was not (older profiles have neither, and show no row)."""
    if p.device_busy_seconds is None:
        return str(p.device_busy_method)
    share = min(1.0, p.device_busy_seconds / p.timing.median)
    return (
        f"{ms(p.device_busy_seconds)} per step, {share:.0%} of the {ms(p.timing.median)} median step, "
        f"idle {1 - share:.0%} ({p.device_busy_method})"
    )


def _estimate_line(p: Profile) -> str:
    """The fake-tensor estimate made before the step ran, with its error against the measured peak."""
    estimated, measured = p.memory.estimated_peak_bytes, p.memory.peak_bytes
    if estimated is None:
        return f"none: {p.memory.estimate_note}" if p.memory.estimate_note else "none"
    error = f", {estimated / measured - 1:+.1%} of the measured" if measured else ""
    return f"{binary_bytes(estimated)} (on fake tensors before the step ran{error})"


def _per_dtype(p: Profile) -> str:
    """Utilisation of each dtype's peak, and the dtype this run's matmuls used."""
    parts = []
    for dtype, share in p.utilisation_by_dtype.items():
        peak = si(p.device.peak.flops_per_s[dtype], "FLOP/s")
        parts.append(
            f"{dtype} {share:.1%} of {peak}" if share is not None else f"{dtype} n/a (the step beats its {peak})"
        )
    return ", ".join(parts) + f" (matmuls ran in {p.compute_dtype})"


def _probe_line(p: Profile) -> str:
    """The host probe the peak and the agents' decisions come from: rates with their spread
    across rounds, the per-op dispatch cost, and what "medium" does to matmul numerics."""
    probe = p.device.probe
    assert probe is not None
    spread = probe.spread()
    parts = []
    for name, label in (("float32_flops_per_s", "fp32"), ("bfloat16_flops_per_s", "bf16")):
        best = getattr(probe, name)
        s = spread.get(name)
        rounds = f" (rounds {s.min / 1e9:.0f}-{s.max / 1e9:.0f} GFLOP/s, CV {s.cv:.0%})" if s else ""
        parts.append(f"{label} matmul {si(best, 'FLOP/s')}{rounds}")
    if probe.dispatch_seconds_per_op is not None:
        parts.append(f"dispatch {probe.dispatch_seconds_per_op * 1e6:.2g} us per op")
    if probe.medium_relative_error is not None:
        kind = "bf16" if probe.medium_changes_numerics else "fp32 (unchanged)"
        parts.append(f'"medium" matmuls are {kind}, relative error {probe.medium_relative_error:.1e}')
    return "; ".join(parts)


def _flops_rows(p: Profile) -> list[tuple[str, str]]:
    """Where the FLOP count is blind (MFU a lower bound), the pre-run estimate, the size notes."""
    rows = []
    if p.flops.uncounted:
        ops = ", ".join(f"{op.name} {op.share:.0%} of the time" for op in p.flops.uncounted)
        rows.append(
            (
                "uncounted work",
                f"{ops} (no FLOP formula): "
                + (
                    "the MFU above is a lower bound"
                    if p.mfu_is_lower_bound
                    else "the counted FLOPs miss it; the model FLOPs come from a formula"
                ),
            )
        )
    if p.estimate is not None:
        rows.append(("estimate before running", f"{p.estimate.describe()} (meta-device pass)"))
    if p.workload.notes:
        rows.append(("notes", "; ".join(p.workload.notes)))
    return rows


def render_terminal(p: Profile) -> str:
    """A compact two-column table plus the top operators, for the CLI to print."""
    rows = summary_rows(p)
    width = max(len(label) for label, _ in rows)
    lines = [f"{label.rjust(width)}  {value}" for label, value in rows]
    lines += ["", f"top operators by self time, per step (torch.profiler over {p.operator_steps} steps):"]
    for op in p.operators:
        lines.append(f"  {op.share:6.1%}  {op.self_ms_per_step:9.3f} ms  {op.calls_per_step:7.1f} calls  {op.name}")
    lines += [f"warning: {warning}" for warning in p.warnings]
    return "\n".join(lines)


def render_markdown(p: Profile) -> str:
    """profile.md: the summary, the FLOPs split, the operators, and how each was measured."""
    out = [f"# Profile of `{p.workload.name}` on {p.device.name}", "", f"Created {p.created}.", ""]
    out += ["| | |", "|---|---|"]
    out += [f"| {label} | {value.replace('|', '/')} |" for label, value in summary_rows(p)]
    out += ["", "## FLOPs counted per operator", "", "| operator | FLOPs per step | share |", "|---|---:|---:|"]
    total = p.flops.counted_per_step or 1
    for op, flops in sorted(p.flops.counted_by_op.items(), key=lambda kv: -kv[1]):
        out.append(f"| `{op}` | {si(flops, 'FLOP')} | {flops / total:.1%} |")
    if p.flops.uncounted:
        out += [
            "",
            "Operators that did work with no FLOP formula, so their work is missing above"
            + (" and the MFU is a lower bound" if p.mfu_is_lower_bound else "")
            + ": "
            + ", ".join(f"`{op.name}` {op.share:.1%} of the profiled time" for op in p.flops.uncounted)
            + " (the rule: docs/flops.md).",
        ]
    out += [
        "",
        f"Parameters: {p.flops.total_parameters:,} in all, {p.flops.matmul_parameters:,} in matmuls (N). "
        f"{p.flops.aten_ops_per_step:,} aten ops per step; unfused memory traffic estimate "
        f"{binary_bytes(p.flops.bytes_unfused_per_step)} per step (every op reads its inputs and writes "
        "its outputs once).",
        "",
        "## Top operators by self time",
        "",
        f"From torch.profiler over {p.operator_steps} steps run after timing "
        "(profiler overhead never touches the timed steps).",
        "",
        "| operator | self time per step | share | calls per step |",
        "|---|---:|---:|---:|",
    ]
    out += [
        f"| `{op.name}` | {ms(op.self_ms_per_step / 1e3)} | {op.share:.1%} | {op.calls_per_step:g} |"
        for op in p.operators
    ]
    out += [
        "",
        "## How these were measured",
        "",
        f"- Step time: {p.timing.count} steps after {p.warmup.steps} warm-up steps, each synced with the "
        "device; median with p10 / p90. Samples (ms): " + ", ".join(f"{s * 1e3:.1f}" for s in p.timing.samples[:50]),
        f"- {p.mfu_convention}. MFU = model FLOPs per step / median step time / that peak of the devices "
        "used; it never exceeds 100% (a step that beats the peak re-measures it, see the warnings).",
        f"- Compilations while timing: {p.compiles_while_timing or 'none'}.",
        *(
            [
                f"- Device busy time: {p.device_busy_method}. Where measured, the device's idle share of the "
                "step is the verdict's overhead term, not ops x the per-op dispatch cost (measured on a tiny "
                "op with a sync, that cost overlaps device work on an asynchronous device)."
            ]
            if p.device_busy_method is not None
            else []
        ),
        "- Environment: " + ", ".join(f"{k} {v}" for k, v in p.environment.items()),
    ]
    if p.warnings:
        out += ["", "## Warnings", ""] + [f"- {w}" for w in p.warnings]
    return "\n".join(out) + "\n"
