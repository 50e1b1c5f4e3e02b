"""report.md's note of faster settings the accuracy guardrail refused, and by how much they missed.

A refused setting is never recommended (no tolerance is loosened for it); the note says what the
tolerance cost, so a user who can accept more error knows what `--tolerance` would buy.
"""

from __future__ import annotations

from typing import Any

from tpu_tuner.core.failures import FailureKind
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
        f"Measured faster than the baseline in the search, but over the tolerance {tolerance:g}; never recommended.",
        "",
    ]
    for _, row in refused.sort_values(records.AMORTISED_STEP_S).iterrows():
        error = float(row[records.ACCURACY_ERROR])
        lines.append(
            f"- trial {int(row['number'])}: {baseline_amortised_s / float(row[records.AMORTISED_STEP_S]):.2f}x the "
            f"baseline's speed (one search measurement), error {error:.2e}: {error / tolerance - 1:.0%} over the "
            "tolerance"
        )
    return lines
