"""Which TPU to rent: the plans of one model on several slices, ranked by tokens/s per chip and by
tokens per dollar.

Each slice contributes its plan's best point (the fitting point of highest predicted MFU, as
plan.json's `best`). Its figures are plan.json's, divided as stated:

* tokens/s per chip = predicted tokens/s / chips in the slice;
* the slice's price per hour = chips x the generation's US dollars per chip-hour (prices.py);
* tokens per dollar = predicted tokens/s x 3600 / the slice's price per hour (tokens/s per dollar
  per second);
* the band: tokens/s is proportional to MFU at a fixed slice and step (MFU = model FLOPs a second /
  peak), so the MFU band of ± b points gives tokens/s x (MFU ± b) / MFU, and the same factor on
  every per-chip and per-dollar figure.

Order: slices where a point fits first, by tokens per dollar (slices without a price after the
priced ones, by tokens/s per chip), then slices where nothing fits, each with why. Every fitting
slice also gets its rank by tokens/s per chip and, where priced, by tokens per dollar.

Plain data in and out (plan.json dicts, ranking.json dicts), standard library only, so the
dashboard reads a ranking without the planner's heavy imports.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from tpu_tuner.planner.plans.prices import Price

RANKING_JSON = "ranking.json"  # the ranking folder's machine-readable ranking
RANKING_MD = "ranking.md"
SECONDS_PER_HOUR = 3600.0


@dataclass
class RankedSlice:
    """One slice of a ranking: its plan's best point and that point's figures per chip and per dollar."""

    topology: str
    generation: str
    chips: int
    devices: int
    fits: bool
    why: str = ""  # why nothing fits (or why the slice was not planned)
    plan_dir: str | None = None  # the slice's plan folder, relative to the ranking folder
    best: str | None = None  # the best point, as plan.json names it
    global_batch: int | None = None
    seq_len: int | None = None
    step_seconds: float | None = None
    tokens_per_second: float | None = None
    mfu: float | None = None
    mfu_band_points: float | None = None
    band_source: str = ""
    tokens_per_second_per_chip: float | None = None
    tokens_per_second_per_chip_low: float | None = None
    tokens_per_second_per_chip_high: float | None = None
    usd_per_chip_hour: float | None = None  # None: no price for this generation
    price_source: str | None = None  # a URL, or "--price"
    usd_per_hour: float | None = None  # the whole slice
    tokens_per_dollar: float | None = None
    tokens_per_dollar_low: float | None = None
    tokens_per_dollar_high: float | None = None
    rank: int = 0  # the ranking's order (1 first)
    rank_per_chip: int | None = None  # among fitting slices, by tokens/s per chip
    rank_per_dollar: int | None = None  # among fitting priced slices, by tokens per dollar

    @property
    def priced(self) -> bool:
        return self.usd_per_chip_hour is not None


@dataclass
class Ranking:
    """A model's slices ranked: what was planned, with which prices, and the order."""

    source: str
    workload: str
    preset: str | None
    slices: list[RankedSlice]
    prices: dict[str, dict[str, Any]]  # generation -> the Price used, as a dict
    topologies: list[str]  # as given, in order
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    seconds: float = 0.0

    @property
    def complete(self) -> bool:
        return len(self.slices) == len(self.topologies)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["order"] = (
            "fitting slices first, by tokens per dollar (unpriced after priced, by tokens/s per chip); "
            "then slices where nothing fits"
        )
        data["definitions"] = {
            "tokens_per_second_per_chip": "tokens_per_second / chips",
            "usd_per_hour": "chips * usd_per_chip_hour",
            "tokens_per_dollar": "tokens_per_second * 3600 / usd_per_hour",
            "band": "low / high = value * (mfu -/+ mfu_band_points / 100) / mfu",
        }
        data["planned"] = len(self.slices)
        return data


def slice_of(plan: dict[str, Any], price: Price | None, plan_dir: str | None = None) -> RankedSlice:
    """A slice's entry from its plan.json dict and its generation's price (None: no price)."""
    topology = plan["topology"]
    entry = RankedSlice(
        topology=topology["name"],
        generation=topology["generation"],
        chips=int(topology["chips"]),
        devices=int(topology["devices"]),
        fits=False,
        plan_dir=plan_dir,
        global_batch=plan.get("global_batch"),
        seq_len=plan.get("seq_len"),
    )
    _price(entry, price)
    fitting = [p for p in plan["plans"] if p.get("fits") and p.get("prediction")]
    if not fitting:
        entry.why = _why_nothing_fits(plan, topology)
        return entry
    best = max(fitting, key=lambda p: p["prediction"]["mfu"])
    prediction, band = best["prediction"], best.get("band") or {}
    entry.fits = True
    entry.best = plan.get("best")
    entry.step_seconds = prediction["step_seconds"]
    entry.tokens_per_second = prediction["tokens_per_second"]
    entry.mfu = prediction["mfu"]
    entry.mfu_band_points = band.get("points")
    entry.band_source = band.get("source", "")
    low, high = band_factors(entry.mfu, entry.mfu_band_points)
    entry.tokens_per_second_per_chip = entry.tokens_per_second / entry.chips
    entry.tokens_per_second_per_chip_low = entry.tokens_per_second_per_chip * low
    entry.tokens_per_second_per_chip_high = entry.tokens_per_second_per_chip * high
    if entry.usd_per_hour:
        entry.tokens_per_dollar = entry.tokens_per_second * SECONDS_PER_HOUR / entry.usd_per_hour
        entry.tokens_per_dollar_low = entry.tokens_per_dollar * low
        entry.tokens_per_dollar_high = entry.tokens_per_dollar * high
    return entry


def unplanned(
    topology: str, generation: str, chips: int, devices: int, reason: str, price: Price | None
) -> RankedSlice:
    """The entry of a slice the planner refused before any point compiled (no layout divides the
    model on it, say): it ranks with the slices where nothing fits, `reason` as why."""
    entry = RankedSlice(topology=topology, generation=generation, chips=chips, devices=devices, fits=False, why=reason)
    _price(entry, price)
    return entry


def band_factors(mfu: float, points: float | None) -> tuple[float, float]:
    """(low, high) multipliers of a predicted throughput for an MFU band of ± `points`."""
    if not points or mfu <= 0:
        return 1.0, 1.0
    return max(0.0, (mfu - points / 100) / mfu), (mfu + points / 100) / mfu


def ranked(slices: list[RankedSlice]) -> list[RankedSlice]:
    """`slices` in the ranking's order, with `rank`, `rank_per_chip` and `rank_per_dollar` set."""
    fitting = [s for s in slices if s.fits]
    for number, entry in enumerate(sorted(fitting, key=lambda s: -(s.tokens_per_second_per_chip or 0.0)), 1):
        entry.rank_per_chip = number
    priced = [s for s in fitting if s.tokens_per_dollar is not None]
    for number, entry in enumerate(sorted(priced, key=lambda s: -(s.tokens_per_dollar or 0.0)), 1):
        entry.rank_per_dollar = number
    order = (
        sorted(priced, key=lambda s: s.rank_per_dollar or 0)
        + sorted((s for s in fitting if s.tokens_per_dollar is None), key=lambda s: s.rank_per_chip or 0)
        + [s for s in slices if not s.fits]
    )
    for number, entry in enumerate(order, 1):
        entry.rank = number
    return order


def _price(entry: RankedSlice, price: Price | None) -> None:
    if price is not None:
        entry.usd_per_chip_hour = price.usd_per_chip_hour
        entry.price_source = price.source
        entry.usd_per_hour = price.usd_per_chip_hour * entry.chips


def _why_nothing_fits(plan: dict[str, Any], topology: dict[str, Any]) -> str:
    """The closest miss: the compiled point with the least HBM short, else the compiler's refusal."""
    hbm = topology.get("hbm_bytes_per_device") or 0.0
    compiled = [p for p in plan["plans"] if not (p.get("compiled") or {}).get("error")]
    if compiled:
        closest = max(compiled, key=lambda p: p.get("margin_bytes", float("-inf")))
        short = -closest.get("margin_bytes", 0.0)
        return (
            f"no point fits in HBM: the closest, {mesh_text(closest['layout'])} (remat {closest.get('remat')}), "
            f"needs {short / 2**30:.2f} GiB more than the {hbm / 2**30:.2f} GiB per device"
        )
    if plan["plans"]:
        error = str(plan["plans"][0]["compiled"]["error"]).strip().splitlines()
        return f"the compiler refused every point ({len(plan['plans'])}): {error[0] if error else 'no reason given'}"
    return "no point was compiled"


def mesh_text(layout: dict[str, Any]) -> str:
    """A plan.json layout as "data 1 x fsdp 4 x tensor 1" (other axes where larger than 1)."""
    base = ("data", "fsdp", "tensor")
    parts = [f"{axis} {layout.get(axis, 1)}" for axis in base]
    parts += [f"{axis} {size}" for axis, size in layout.items() if axis not in base and size != 1]
    return " x ".join(parts)


__all__ = [
    "RANKING_JSON",
    "RANKING_MD",
    "RankedSlice",
    "Ranking",
    "band_factors",
    "mesh_text",
    "ranked",
    "slice_of",
    "unplanned",
]
