"""Human-readable numbers with units."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tpu_tuner.core.errors import UserInputError

_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0}


def si(value: float | None, unit: str, digits: int = 3) -> str:
    """1.23e12, "FLOP/s" -> "1.23 TFLOP/s"."""
    if value is None:
        return "n/a"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g} {prefix}{unit}"
    return f"{value:.{digits}g} {unit}"


def binary_bytes(value: float | None) -> str:
    """Bytes in MiB / GiB."""
    if value is None:
        return "n/a"
    for factor, unit in ((1024**3, "GiB"), (1024**2, "MiB"), (1024, "KiB")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {unit}"
    return f"{value:.0f} B"


def duration(seconds: float | None) -> str:
    """A time in the unit that keeps it short: "850 µs", "12.3 ms", "14.1 s", "6.3 min", "2.1 h".

    Three significant digits; never scientific notation (a 14-second step is "14.1 s", not
    "1.412e+04 ms").
    """
    if seconds is None or seconds != seconds:  # None or NaN
        return "n/a"
    magnitude = abs(seconds)
    if magnitude >= 2 * 3600:
        return f"{seconds / 3600:.1f} h"
    if magnitude >= 120:
        return f"{seconds / 60:.1f} min"
    for factor, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if magnitude >= factor * 0.9995:  # 0.9999 s reads "1.00 s", not "1000 ms"
            return f"{_three_digits(seconds / factor)} {unit}"
    return "0 s" if magnitude == 0 else f"{_three_digits(seconds * 1e9)} ns"


def _three_digits(value: float) -> str:
    """Three significant digits in fixed notation: 14.1, 612, 2.35 (1234 stays 1234)."""
    for decimals in (2, 1):
        # Decide on the rounded value, so that 99.96 reads "100", not "100.0".
        if abs(round(value, decimals)) < 10 ** (3 - decimals):
            return f"{value:.{decimals}f}"
    return f"{value:.0f}"


# Kept under its old name for callers: every time shown goes through duration().
ms = duration


def shape(workload: Mapping[str, Any]) -> str:
    """ "batch 8, seq 128": only the sizes that apply (a file without a sequence length shows no
    "seq None")."""
    parts = [
        f"{label} {workload[key]}"
        for key, label in (("batch_size", "batch"), ("seq_len", "seq"))
        if workload.get(key) is not None
    ]
    return ", ".join(parts)


def parse_duration(text: str) -> float | None:
    """Seconds of "10m", "90s", "1h30m" or "600" (seconds); "none" or "0": no limit (None)."""
    cleaned = text.strip().lower()
    if cleaned in ("none", "0", "off"):
        return None
    if re.fullmatch(r"\d+(\.\d+)?", cleaned):
        return float(cleaned)
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([hms])", cleaned)
    if not parts or "".join(f"{n}{u}" for n, u in parts) != re.sub(r"\s+", "", cleaned):
        raise UserInputError(f"--time-budget {text!r}: give a duration such as 10m, 90s, 1h30m, or none")
    return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
