"""report.md's note of faster settings the accuracy guardrail refused, and by how much they missed.

A refused setting is never recommended (no tolerance is loosened for it); the note says what the
tolerance cost, so a user who can accept more error knows what `--tolerance` would buy. The
tolerance bounds how much less accurate than the baseline a setting may be (its relative error
against fp32 beyond the baseline's: execution/measurement.py); a trial of an earlier version,
without the baseline's figures, was judged by its error against fp32.
"""

from __future__ import annotations

from typing import Any

from tpu_tuner.core.failures import FailureKind
from tpu_tuner.outputs.trial_sources import present
from tpu_tuner.studies import records


def refused_faster(frame: Any, baseline_amortised_s: float | None, tolerance: float) -> list[str]:
    """Lines for the trials (rows of the trials table) that failed only the accuracy check while
    measuring faster than the baseline; empty where there are none or no baseline was measured."""
    if baseline_amortised_s is None or records.FAILURE_KIND not in frame or records.AMORTISED_STEP_S not in frame:
        return []
    refused = frame[(frame[records.FAILURE_KIND] == FailureKind.ACCURACY) & frame[records.AMORTISED_STEP_S].notna()]
    refused = refused[refused[records.AMORTISED_STEP_S] < baseline_amortised_s]
    if refused.empty:
        return []
    lines = [
        "",
        "## Faster settings the accuracy guardrail refused",
        "",
        "Measured faster than the baseline in the search, but more than the tolerance "
        f"{tolerance:g} less accurate than the baseline (relative error against fp32); never recommended.",
        "",
    ]
    for _, row in refused.sort_values(records.AMORTISED_STEP_S).iterrows():
        error = float(row[records.ACCURACY_ERROR])
        excess, figures = error, f"error {error:.2e}"
        if present(row.get(records.ACCURACY_EXCESS)):
            excess = float(row[records.ACCURACY_EXCESS])
            figures += (
                f" vs fp32, baseline {float(row[records.BASELINE_ACCURACY_ERROR]):.2e}: {excess:.2e} more than the "
                "baseline"
            )
        lines.append(
            f"- trial {int(row['number'])}: {baseline_amortised_s / float(row[records.AMORTISED_STEP_S]):.2f}x the "
            f"baseline's speed (one search measurement), {figures}: {excess / tolerance - 1:.0%} over the tolerance"
        )
    return lines
