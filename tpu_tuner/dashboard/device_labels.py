"""How the page names a run's device and the peak its MFU is measured against.

MFU is a share of one device's peak, and peaks differ in kind as well as size: a TPU's or GPU's comes
from its spec table (torch_tpu's hardware table, NVIDIA's datasheet), a CPU's is measured on the host
by the roofline probe (docs/design.md, "CPU peak is measured"). So every MFU the page shows says whose
peak it is, and the MFU figures keep device kinds apart (one figure per kind, chips first).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from tpu_tuner.core.units import si
from tpu_tuner.dashboard.folder_files import finite

# The MFU figures' value axis: a figure holds one device kind, each run's MFU of its own device's peak.
MFU_AXIS = "MFU, % of each device's own peak"
# Chips before hosts: the page is about TPUs, and a CPU run is the reference beside them.
KIND_ORDER = ("tpu", "cuda", "cpu")
# How a peak was obtained (profile.json's device): a probe measured it, or the backend looked it up.
MEASURED, SPEC = "measured", "spec"


def text(value: Any) -> str:
    """A table cell's text ('' for None, NaN or an empty string)."""
    return "" if value is None or (isinstance(value, float) and pd.isna(value)) else str(value).strip()


def device_label(kind: Any, name: Any) -> str:
    """The device as every row names it: its kind and its name ("tpu: TPU v5e",
    "cpu: Intel(R) Xeon(R) Processor @ 2.60GHz"); what is known where one is missing."""
    kind, name = text(kind), text(name)
    if kind and name and name.lower() != kind.lower():
        return f"{kind}: {name}"
    return kind or name or "unknown device"


def peak_basis(device: dict[str, Any]) -> str | None:
    """MEASURED where profile.json's device holds the probe that measured its peak, or is a CPU (whose
    peak is always measured; older profiles kept no probe), SPEC where the backend gave a peak from its
    table (a TPU, a GPU), None where the device records no peak."""
    if not isinstance(device, dict) or not isinstance(device.get("peak"), dict):
        return None
    return MEASURED if device.get("probe") or device.get("kind") == "cpu" else SPEC


def peak_text(row: pd.Series | dict[str, Any], basis: bool = True) -> str:
    """The peak a row's MFU is a share of ("197 TFLOP/s bfloat16, spec"), or "" when none is recorded."""
    peak = row.get("peak_flops_per_s")
    if not finite(peak):
        return ""
    parts = [si(peak, "FLOP/s")]
    if text(row.get("peak_dtype")):
        parts.append(text(row.get("peak_dtype")))
    said = " ".join(parts)
    return f"{said}, {text(row.get('peak_basis'))}" if basis and text(row.get("peak_basis")) else said


def mfu_of(row: pd.Series | dict[str, Any]) -> str:
    """Whose peak a row's MFU is a share of, in words (the MFU cell's hover text)."""
    peak = peak_text(row)
    device = device_label(row.get("device"), row.get("device_name"))
    if not peak:
        return f"MFU of {device}'s peak (its figure is not recorded in this run folder)"
    source = text(row.get("peak_source"))
    return f"MFU of {device}'s {peak} peak" + (f" ({source})" if source else "")


def kind_of(value: Any) -> str:
    """A row's device kind as the figures group it ('unknown' when the run does not say)."""
    return text(value).lower() or "unknown"


def by_kind(rows: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """`rows` split by device kind, chips first (KIND_ORDER), then any other kind by name."""
    kinds = rows["device"].map(kind_of)
    order = sorted(set(kinds), key=lambda k: (KIND_ORDER.index(k) if k in KIND_ORDER else len(KIND_ORDER), k))
    return [(kind, rows[kinds == kind]) for kind in order]


def kind_title(kind: str, rows: pd.DataFrame, limit: int = 2) -> str:
    """One device kind's heading: its runs, whose peak their MFU is of, and those peaks
    ("TPU runs: MFU of each chip's own spec peak (TPU v5e: 197 TFLOP/s bfloat16)")."""
    bases = {text(b) for b in rows.get("peak_basis", pd.Series(dtype=object)) if text(b)}
    basis = f"{bases.pop()} " if len(bases) == 1 else ""
    whose = "host" if kind == "cpu" else "chip" if kind == "tpu" else "device"
    peaks = []
    for (name, _), group in rows.groupby(["device_name", "peak_flops_per_s"], dropna=False, sort=False):
        said = peak_text(group.iloc[0], basis=False)
        if said:
            peaks.append(f"{text(name) or kind}: {said}")
    shown = "; ".join(peaks[:limit]) + (f"; {len(peaks) - limit} more in the runs table" if len(peaks) > limit else "")
    return f"{kind.upper()} runs: MFU of each {whose}'s own {basis}peak" + (f" ({shown})" if shown else "")
