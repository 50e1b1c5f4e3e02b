"""report.md of a tuning run."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from tpu_tuner.core.units import binary_bytes, ms
from tpu_tuner.metrics.mfu import MFU_CONVENTION, common_peak, mfu, mfu_text
from tpu_tuner.outputs.guardrail_refusals import refused_faster
from tpu_tuner.outputs.trial_costs import cost_line
from tpu_tuner.outputs.trial_sources import hosts_section, ms_or_blank, present, warm_start_section
from tpu_tuner.outputs.verification_lines import contributions_section, disturbed_lines, unsteady_lines
from tpu_tuner.studies import records
from tpu_tuner.studies.outcome import Outcome, tally

if TYPE_CHECKING:
    from tpu_tuner.execution.measurement import Measurement
    from tpu_tuner.tuning.run.tuning_result import TuningResult
    from tpu_tuner.tuning.verify.window_figures import ComparedSteps


def _ranks_line(nproc: int, training: bool, nnodes: int = 1) -> str:
    hosts = (
        f" ({nnodes} hosts of {nproc // nnodes}: see the hosts' findings for the ranks each held)" if nnodes > 1 else ""
    )
    if not training:
        return (
            f"Every trial ran on {nproc} ranks{hosts}, one process each, on the same global batch (each data x fsdp "
            "rank its slice; the ranks of a tensor group share one): a step is the slowest rank's forward (every "
            "step starts and ends on a barrier), peak memory the largest rank's, and the accuracy check compares "
            "the ranks' outputs, gathered in batch order, with one process's fp32 output of the whole batch. "
            "The baseline is data parallel (replicas of the model: an inference step has no gradient to sync)."
        )
    return (
        f"Every trial ran on {nproc} ranks{hosts}, one process each, on the same global batch (each rank its slice): "
        "a step is the slowest rank's (every step starts and ends on a barrier), peak memory the largest rank's, "
        "and the accuracy check compares the loss averaged over the ranks and the gradients gathered from their "
        "shards with one process's fp32 step on the whole batch. The baseline is data parallel (DDP)."
    )


def render_report(result: TuningResult, plots: dict[str, Path]) -> str:
    v = result.verification
    compared = result.compared
    base, chosen = compared.baseline, compared.tuned
    planned = result.options.objective.planned_steps
    out = [
        f"# Tuning `{result.profile.workload.name}` on {result.profile.device.name}",
        "",
        f"{', '.join(filter(None, (result.profile.workload.step, result.workload_sizes)))}. "
        "Objective: amortised step time (steady step + compile "
        f"time / {planned} planned steps). {_tolerance_line(result)}",
        "",
        *_fitted_lines(result.profile.fitted_to_memory, result.profile.warnings),
        (
            f"**Recommendation: {v.chosen.describe()}.** {v.message}"
            if result.verified
            else f"**No recommendation from this worker of study `{result.study.study_name}`:** {v.message}. "
            "The search's trials below are the whole study's as this worker last saw them."
        ),
        "",
        *(
            [
                _ranks_line(
                    result.options.runner.ranks, result.profile.workload.training, result.options.runner.nnodes
                ),
                "",
            ]
            if result.options.runner.ranks > 1
            else []
        ),
        *(_figures_note(compared, v.speedup is not None, v.recommends_tuned, planned) + [""]),
        "## Baseline against tuned",
        "",
        "| | baseline | tuned |",
        "|---|---:|---:|",
    ]
    if base is not None and result.profile.memory.peak_bytes is not None:
        # The baseline's peak as the profile measured it, the figure its findings give too: one
        # figure a run (a trial's own measurement of the same step read 656 MiB beside 677).
        base = replace(base, peak_memory_bytes=result.profile.memory.peak_bytes)
    out += comparison_rows(base, chosen, planned, compared.where)
    if compared.from_window:
        # The search's one measurement of each, for the record: a disturbed one shows here.
        out.append(
            f"| steady step in the search (one measurement) | {_search_step(result.baseline)} | "
            f"{_search_step(result.chosen)} |"
        )
        out += ["", *result.step_disagreements] if result.step_disagreements else []
    bucketing = result.chosen_bucketing()
    if bucketing:
        out += [
            "",
            "## Shape buckets (inputs vary in length)",
            "",
            f"Chosen buckets `{bucketing['buckets']}` ({bucketing['padding_waste']:.1%} of processed tokens are "
            "padding). Every trial's objective is its expected step over the length sample with the bucketing "
            "best for it (exact DP: its measured compile time per shape, its steady step scaled by the step-time "
            "curve measured at the start); the interleaved comparison above is at the reference length. "
            f"On TorchTPU: {bucketing['torchtpu']}.",
        ]
    if v.race:
        out += [
            "",
            "## The search's leaders, raced",
            "",
            "The search measured each setting once; its fastest settings (up to 5) within 15% of the best were "
            "re-measured round-robin with the baseline in one worker, and the fastest there (steady step + the "
            "search's compile time / planned steps) is the one verified above.",
            "",
            "| trial | setting | search (amortised) | raced (amortised) | over the baseline, raced |",
            "|---:|---|---:|---:|---:|",
        ]
        out += [
            f"| {e.trial} | {e.label}{' (chosen)' if e.trial == v.best_trial else ''} | "
            f"{e.search_amortised_s * 1e3:.1f} ms | {e.interleaved_amortised_s * 1e3:.1f} ms | "
            f"{e.speedup_over_baseline:.2f}x |"
            for e in v.race
        ]
    out += ["", "## What each knob contributed", "", *contributions_section(v)]
    out += ["", "## Agents' findings from the profile", ""]
    for agent, findings in result.findings.items():
        out += [f"- **{agent}**: " + "; ".join(findings)]
    out += ["", f"Baseline profile verdict: {result.profile.verdict.summary}", ""]
    out += warm_start_section(result) + hosts_section(result)
    frame = result.trials_dataframe()
    out += [
        "## Trials",
        "",
        f"{tally([Outcome(o) for o in frame['outcome']])}; sampler {result.options.search.sampler}, search space "
        f"`{result.space.name}` ({result.space.size()} valid settings for this workload); every row is in "
        "trials.csv.",
        "",
    ]
    if result.space.left_out:
        out += ["Left out of the space for this workload (they cannot change its step):", ""]
        out += [f"- {line}" for line in result.space.left_out] + [""]
    out += [
        "| # | outcome | settings | amortised | step | compile | MFU | error vs fp32 | vs baseline | note |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for _, row in frame.iterrows():
        # In the knobs' own words ("inductor, matmul medium, autocast bfloat16"), not bare values.
        params = {p.name: row[p.name] for p in result.space.searched if present(row.get(p.name))}
        settings = result.space.to_candidate(params).describe() or "baseline"
        note = next(
            (
                str(row[k])
                for k in (records.FAILURE_MESSAGE, records.REJECTED_BY, records.STOPPED_EARLY)
                if present(row.get(k))
            ),
            "",
        )
        if present(row.get(records.EXCLUDED_BY)):
            note = f"excluded ({row[records.EXCLUDED_BY]}): not measured"
        if present(row.get(records.REPEAT_OF)):
            note = f"repeat of trial {int(row[records.REPEAT_OF])}, not re-measured" + (f"; {note}" if note else "")
        step, mfu_cell = ms_or_blank(row.get(records.STEP_MEDIAN_S)), _pct(row.get(records.MFU))
        superseded = present(row.get(records.SUPERSEDED)) and bool(row[records.SUPERSEDED])
        if superseded:  # one figure per setting: the window's stands (tuning/verify/window_marks.py)
            step += f" -> {ms_or_blank(row.get(records.WINDOW_STEP_S))}"
            mfu_cell += f" -> {_pct(row.get(records.WINDOW_MFU))}" if present(row.get(records.WINDOW_MFU)) else ""
            note = str(row[records.FIGURE_NOTE]) + (f"; {note}" if note else "")
        out.append(
            f"| {row['number']} | {_state(row)} | {settings} | {ms_or_blank(row.get(records.AMORTISED_STEP_S))} | "
            f"{step} | {ms_or_blank(row.get(records.COMPILE_S))} | {mfu_cell} | "
            f"{_sci(row.get(records.ACCURACY_ERROR))} | {_sci(row.get(records.ACCURACY_ERROR_VS_BASELINE))} | "
            f"{note.replace('|', '/')} |"
        )
    failures = frame[frame[records.FAILURE_KIND].notna()] if records.FAILURE_KIND in frame else frame.iloc[0:0]
    out += ["", "## Failures", ""]
    if len(failures):
        out += [
            f"- trial {int(r['number'])}: **{r[records.FAILURE_KIND]}**: {r.get(records.FAILURE_MESSAGE, '')}"
            for _, r in failures.iterrows()
        ]
    else:
        out.append("None.")
    baseline_amortised = None if result.baseline is None else result.baseline.amortised_step(planned)
    out += refused_faster(frame, baseline_amortised, result.options.objective.tolerance)
    out += _learned_section(result, frame)
    trial_settings = result.options.runner.trial_settings
    assert trial_settings is not None, "a run's result holds the trial settings it resolved"
    out += ["", "## Plots", ""] + [f"![{title}]({path.name})" for title, path in plots.items()]
    out += [
        "",
        "## How these were measured",
        "",
        f"- Each trial ran in an isolated worker: first call (compile) timed alone, warm-up until no compiles, then "
        f"at least {trial_settings.timing_min_steps} samples, each a block of steps run back to back and ended by a "
        "host read of the block's result (one step on a CPU: execution/timer.py); median per step reported.",
        "- The verification re-ran baseline, best and the knob ablations round-robin in one worker "
        f"({v.speedup.rounds if v.speedup else 0} rounds kept); speedups are geometric means of per-round ratios "
        "with t intervals stated at 95% for the window as a whole: rounds are added until the interval decides, "
        "and each look takes its share of the 5% (97% at the first, more at each look after it), so that all "
        f"its looks together miss at most 5% of the time (docs/tuning.md). Verdict: {v.verdict_kind}.",
        *disturbed_lines(v),
        *unsteady_lines(v),
        f"- MFU: model FLOPs ({result.profile.flops.model_formula}) / median step / peak. {MFU_CONVENTION}; "
        "baseline and trials alike, so MFU rises exactly when a setting gets faster.",
        cost_line(frame, result.worker_starts),
    ]
    if v.compiles_while_comparing and any(v.compiles_while_comparing.values()):
        out.append(f"- Warning: compilations during the interleaved window: {v.compiles_while_comparing}.")
    return "\n".join(out) + "\n"


def _state(row) -> str:
    """A trial's outcome in the one vocabulary of every output (studies/outcome.py)."""
    return str(row["outcome"]) if present(row.get("outcome")) else str(row["state"])


def _learned_section(result: TuningResult, frame) -> list[str]:
    """What the search learned from its failures, and the trials it stopped early."""
    causes = result.exclusions
    stopped = int(frame[records.STOPPED_EARLY].notna().sum()) if records.STOPPED_EARLY in frame else 0
    out = ["", "## What the search learned", ""]
    if causes:
        out += [f"- {words}" for words in causes]
        out += [
            "",
            "A setting holding an excluded value (or pair) is never measured again; the sampler redraws "
            'proposals that hold one (docs/tuning.md, "Failures, hopeless trials and the clock").',
        ]
    else:
        out.append("No failure cause found (a cause needs two failures of a kind, and no success, with one value).")
    out += [f"- Not blamed: {words}" for words in result.not_blamed]
    if stopped:
        out += [
            "",
            f"{stopped} trial(s) stopped early: their first steady steps put them beyond "
            "1.5x the best objective so far (with the compile time they spent), so the rest of their "
            "measurement could not have made them the best.",
        ]
    return out


def _figures_note(compared: ComparedSteps, verified: bool, significant: bool, planned: int) -> list[str]:
    """Where the table's steps come from, and how they relate to the verified speedup."""
    if compared.from_window:
        ratio = ""
        if not significant:
            ratio = " (the recommendation is the baseline, so both columns are its figures)"
        elif compared.ratio is not None:
            ratio = (
                f" (their ratio, {compared.ratio:.2f}x, is a ratio of medians; the verified speedup is the "
                "geometric mean of the per-round ratios, the estimate its interval belongs to: from the same "
                "rounds they agree closely when the rounds are steady, less when they are few and noisy)"
            )
        return [
            f"The verified speedup compares *steady* steps (compile time excluded), re-measured round-robin in one "
            "window. The table's steady steps and MFU are from that window: each setting's median over the "
            f"same {compared.rounds} rounds{ratio}. Compile time, peak memory and accuracy error "
            "are the search's, and the \"amortised step\" row, which the search ranked by, adds the search's "
            f"compile time / {planned} planned steps to the window's step."
        ]
    if verified:
        return [
            f"The verified speedup compares *steady* steps (compile time excluded), re-measured round-robin in "
            f"one window; the table's figures are the search's ({compared.why_search}), measured at different "
            'moments, so their ratio can differ. The "amortised step" row, which the search ranked by, adds '
            f"compile time / {planned} planned steps."
        ]
    return [
        f"The table's figures are the search's one measurement of each setting ({compared.why_search}); "
        f'the "amortised step" row adds compile time / {planned} planned steps.'
    ]


def _search_step(m: Measurement | None) -> str:
    return "n/a" if m is None else f"{ms(m.step_median)} (p10 {ms(m.step_p10)}, p90 {ms(m.step_p90)})"


def comparison_rows(
    base: Measurement | None, chosen: Measurement | None, planned: int, where: str = "search"
) -> list[str]:
    """The report's baseline-against-tuned table rows (settings, steady step from `where`: the search
    or the window, compile, amortised over `planned` steps, MFU on one peak, memory, accuracy)."""

    def cell(m: Measurement | None, fn) -> str:
        return "n/a" if m is None else fn(m)

    # Both columns divide by one peak: the higher of the two (a trial that beat the profile's
    # peak re-measured or raised it), so neither can read above 100% and they stay comparable.
    common = common_peak(
        ((m.peak_flops_per_s, m.peak_dtype) for m in (base, chosen) if m is not None), default=(0.0, "")
    )

    rows = [
        ("settings", lambda m: _describe(m)),
        (
            f"steady step (median, {where})",
            lambda m: f"{ms(m.step_median)} (p10 {ms(m.step_p10)}, p90 {ms(m.step_p90)})",
        ),
        ("compile time (search)", lambda m: ms(m.compile_seconds)),
        (f"amortised step ({planned} steps)", lambda m: ms(m.amortised_step(planned))),
        ("MFU", lambda m: _mfu_cell(m, common)),
        ("peak memory", lambda m: binary_bytes(m.peak_memory_bytes)),
        ("peak memory estimated before the step ran", _estimate_cell),
        ("accuracy error vs fp32", lambda m: f"{m.accuracy_error:.2e}"),
        ("accuracy error vs the baseline's outputs", lambda m: _sci_or_na(m.error_vs_baseline)),
    ]
    return [f"| {label} | {cell(base, fn)} | {cell(chosen, fn)} |" for label, fn in rows]


def _estimate_cell(m: Measurement) -> str:
    """The fake-tensor estimate and its error against the measured peak, or why there is none."""
    if m.estimated_peak_bytes is None:
        return f"none: {m.estimate_note}" if m.estimate_note else "none"
    error = m.estimate_error
    return binary_bytes(m.estimated_peak_bytes) + (f" ({error:+.1%} of the measured)" if error is not None else "")


def _mfu_cell(m: Measurement, peak: tuple[float, str]) -> str:
    """MFU against the common peak, with the dtype the setting's matmuls ran in."""
    value = mfu(m.model_flops_per_step, m.step_median, peak[0])
    ran_in = f"; matmuls in {m.compute_dtype}" if m.compute_dtype else ""
    return f"{mfu_text(value)} of {peak[0] / 1e9:.0f} GFLOP/s ({peak[1]}, the fastest dtype){ran_in}"


def _describe(m: Measurement) -> str:
    from tpu_tuner.knobs.candidate import Candidate

    return Candidate.from_dict(m.candidate).describe()


def _fitted_lines(fitted: dict[str, str], warnings: list[str]) -> list[str]:
    """Where the step as given did not fit the device: what the run's baseline is instead
    (profiling/memory_fit.py wrote the profile's note)."""
    from tpu_tuner.profiling.memory_fit import FITTED_NOTE

    if not fitted:
        return []
    note = next((w for w in warnings if w.startswith(FITTED_NOTE)), "the step as given does not fit")
    return [f"**The step as written does not fit the device**: {note}. Speedups here are over that baseline.", ""]


def _tolerance_line(result: TuningResult) -> str:
    """The guardrail's rule, with the baseline's own error against fp32 where it was measured."""
    tolerance, base = result.options.objective.tolerance, result.baseline
    own = "" if base is None or base.baseline_error is None else f"; the baseline's own: {base.accuracy_error:.2e}"
    return (
        f"Accuracy tolerance {tolerance:g}: how much a setting's relative error against fp32 eager may exceed the "
        f'baseline\'s{own} (docs/tuning.md, "Accuracy against the baseline").'
    )


def _sci_or_na(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2e}"


def _pct(value) -> str:
    return f"{float(value):.1%}" if present(value) else ""


def _sci(value) -> str:
    return f"{float(value):.1e}" if present(value) else ""
