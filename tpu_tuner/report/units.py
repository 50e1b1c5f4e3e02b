"""Human-readable numbers with units."""

from __future__ import annotations


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


def ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.4g} ms"
