"""A roofline probe's record: the measured figures of one device (the best round of each, every
round kept for the spread), whether it was taken under load, and the merge of an old probe with a
new one. devices/roofline.py measures and caches it."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from tpu_tuner.devices.peak import DevicePeak

# Bumped whenever the probe's fields or method change: older cache entries are then ignored.
PROBE_VERSION = 2
# A probe taken while the machine was busy: 1-minute load average above this share of its usable cores.
LOADED_SHARE = 0.5
MAX_ROUNDS_KEPT = 30
# fp32 rounding gives a relative error near 1e-7 on a 512-deep matmul, one bf16 pass near 1e-3:
# anything above this threshold means "medium" really runs the matmul in lower precision.
LOWER_PRECISION_ERROR = 1e-5


@dataclass(frozen=True)
class Spread:
    """How much one probe figure varied across rounds."""

    min: float
    median: float
    max: float
    cv: float  # standard deviation / mean; 0 for a single round

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        if not values:
            raise ValueError("no probe rounds")
        mean = statistics.fmean(values)
        cv = statistics.stdev(values) / mean if len(values) > 1 and mean else 0.0
        return cls(min(values), statistics.median(values), max(values), cv)


@dataclass(frozen=True)
class RooflineProbe:
    """Measured figures of one device: per figure, the best round; `rounds` keeps every round."""

    float32_flops_per_s: float
    bfloat16_flops_per_s: float
    copy_bytes_per_s: float
    matmul_size: int
    copy_bytes: int
    repeats: int
    measured_at: str
    dispatch_seconds_per_op: float | None = None
    # Relative error of an fp32 matmul under "medium" against "highest" (None: not measured).
    medium_relative_error: float | None = None
    rounds: dict[str, list[float]] = field(default_factory=dict)
    measured_at_epoch: float = 0.0
    version: int = PROBE_VERSION
    load_average: float | None = None  # 1-minute load average when the probe started
    cores: int | None = None  # usable cores then
    # A re-probe that raised a peak keeps the peaks it replaced and when (MFU figures of earlier
    # runs divided by those, so they compare with later ones only with both figures said).
    raised_from: dict[str, float] | None = None
    raised_at: str | None = None

    @property
    def under_load(self) -> bool:
        """Whether other work kept the machine busy when the probe started (its figures read low)."""
        if self.load_average is None or not self.cores:
            return False
        return self.load_average > LOADED_SHARE * self.cores

    def to_peak(self, source: str) -> DevicePeak:
        """The probe as a backend's peak table (fp32 and bf16 FLOP/s, copy bandwidth)."""
        return DevicePeak(
            flops_per_s={"float32": self.float32_flops_per_s, "bfloat16": self.bfloat16_flops_per_s},
            memory_bytes_per_s=self.copy_bytes_per_s,
            source=source,
        )

    def spread(self) -> dict[str, Spread]:
        """Min / median / max / CV across rounds of every figure measured in rounds."""
        return {name: Spread.of(values) for name, values in self.rounds.items() if values}

    @property
    def bf16_speed_ratio(self) -> float:
        """bf16 matmul rate over fp32: about 2-4 with bf16 matmul units, below 1 without."""
        return self.bfloat16_flops_per_s / self.float32_flops_per_s

    @property
    def medium_changes_numerics(self) -> bool | None:
        """Whether "medium" runs fp32 matmuls in lower precision here (None: not measured)."""
        if self.medium_relative_error is None:
            return None
        return self.medium_relative_error > LOWER_PRECISION_ERROR

    def describe(self) -> str:
        """One line: what was timed, how often, when, and the fp32 spread across rounds."""
        fp32 = self.spread().get("float32_flops_per_s")
        count = len(self.rounds.get("float32_flops_per_s", []))
        rounds = f"best of {count} rounds x {self.repeats}" if count else f"best of {self.repeats}"
        spread_text = (
            f"; fp32 rounds {fp32.min / 1e9:.0f}-{fp32.max / 1e9:.0f} GFLOP/s (CV {fp32.cv:.0%})" if fp32 else ""
        )
        load = (
            f"; taken under load (load average {self.load_average:.1f} on {self.cores} cores): "
            "re-measured within the hour"
            if self.under_load
            else ""
        )
        return (
            f"measured roofline probe: {self.matmul_size}x{self.matmul_size} matmuls and a "
            f"{self.copy_bytes // 1024**2} MiB copy, {rounds}, at {self.measured_at}{spread_text}{load}"
            f"{self.raised_note()}"
        )

    def raised_note(self) -> str:
        """Where a re-probe raised the peak: from what, to what and when, MFU's denominator having
        moved (issue 55: 1772 -> 1970 GFLOP/s between two runs an hour apart, unsaid); else ""."""
        if not self.raised_from:
            return ""
        now = {"float32": self.float32_flops_per_s, "bfloat16": self.bfloat16_flops_per_s}
        moved = ", ".join(
            f"{dtype} {old / 1e9:.0f} -> {now[dtype] / 1e9:.0f} GFLOP/s"
            for dtype, old in self.raised_from.items()
            if dtype in now and now[dtype] != old
        )
        return (
            f"; peak last raised at {self.raised_at} ({moved}): "
            "MFU figures of runs before then divided by the lower peak"
        )

    def merged_with(self, other: RooflineProbe) -> RooflineProbe:
        """The best of two probes of the same machine: a re-probe never lowers a peak."""
        # The latest rounds of both (bounded: a machine under load for days re-probes hourly).
        rounds = {
            name: (self.rounds.get(name, []) + other.rounds.get(name, []))[-MAX_ROUNDS_KEPT:]
            for name in {*self.rounds, *other.rounds}
        }
        dispatch = [v for v in (self.dispatch_seconds_per_op, other.dispatch_seconds_per_op) if v is not None]
        newer = max(self, other, key=lambda p: p.measured_at_epoch)
        older = other if newer is self else self
        peaks = {
            "float32": (older.float32_flops_per_s, max(self.float32_flops_per_s, other.float32_flops_per_s)),
            "bfloat16": (older.bfloat16_flops_per_s, max(self.bfloat16_flops_per_s, other.bfloat16_flops_per_s)),
        }
        raised = {dtype: old for dtype, (old, new) in peaks.items() if new > old}
        return RooflineProbe(
            float32_flops_per_s=max(self.float32_flops_per_s, other.float32_flops_per_s),
            bfloat16_flops_per_s=max(self.bfloat16_flops_per_s, other.bfloat16_flops_per_s),
            copy_bytes_per_s=max(self.copy_bytes_per_s, other.copy_bytes_per_s),
            matmul_size=newer.matmul_size,
            copy_bytes=newer.copy_bytes,
            repeats=newer.repeats,
            measured_at=newer.measured_at,
            dispatch_seconds_per_op=min(dispatch) if dispatch else None,
            medium_relative_error=newer.medium_relative_error,
            rounds=rounds,
            measured_at_epoch=newer.measured_at_epoch,
            load_average=newer.load_average,
            cores=newer.cores,
            # The earliest peaks replaced are kept: what the runs before the first raise divided by.
            raised_from={**raised, **(older.raised_from or {})} if raised or older.raised_from else None,
            raised_at=newer.measured_at if raised else older.raised_at,
        )
