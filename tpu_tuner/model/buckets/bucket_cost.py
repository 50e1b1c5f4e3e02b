"""What a planned run costs under a bucketing: compiles plus padded steps.

The model, stated so it can be checked (`benchmarks/bucketing/bucketing_replay.py` measures it):

* every distinct bucket bound is compiled once. What a new shape costs is measured at each probed
  length (`ShapeCost`: the first step at the length minus a warm step, counted only where the
  backend's compile counter confirms a compilation; a cache hit costs nothing) and fitted as
  C(L) = p + q L (non-negative least squares), so the optimiser charges a long bound what a long
  shape measured to cost; without per-length measurements it is one constant, `compile_seconds`;
* a step at padded length L takes t(L) = a + b L + c L^2 seconds, fitted by non-negative least
  squares to steady step times measured at several lengths (the quadratic term is attention's);
  non-negative coefficients keep t increasing in L, which the optimiser relies on;
* a run of S steps draws each step's length from the sample's distribution; a step runs at the
  smallest bound that holds its length (bucketed pipelines batch a bucket's requests together).

expected total = sum over compiled bounds u of C(u) + S x sum_L p(L) t(bound(L)).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import nnls


@dataclass(frozen=True)
class ShapeCost:
    """What one new padded length cost on the device, measured in the worker.

    `compilations`, `cache_hits` and `cache_requests` are the backend's counters over the first
    step at the length (`counter` names the compile counter read: TorchTPU's
    ``tpu_compilations``, else dynamo's ``torch_compile_graphs``; None where the backend has
    none). `compile_seconds` is first minus warm where the counter saw a compilation, 0 where it
    saw none (a cache hit: the shape was compiled already), first minus warm unconfirmed where
    there is no counter."""

    length: int
    first_seconds: float  # the first step at this length, its compile included
    warm_seconds: float  # the median warm step at this length
    compile_seconds: float
    compilations: int | None = None
    cache_hits: int | None = None
    cache_requests: int | None = None
    counter: str | None = None
    warm_compilations: int = 0  # compilations the warm steps still counted (a warm step that was not)

    @property
    def compiled(self) -> bool:
        """The first step compiled (or, with no counter, is taken to have)."""
        return self.compilations is None or self.compilations > 0

    @property
    def cache_hit(self) -> bool:
        """The device compiled nothing for this new length and reused a program from its cache."""
        return self.compilations == 0 and bool(self.cache_hits)

    @classmethod
    def measured(
        cls, length: int, first: float, warm: float, delta: dict[str, int], warm_compilations: int = 0
    ) -> ShapeCost:
        """The cost of `length` from its first step's seconds, a warm step's and the compile
        counters' change over the first step (`devices.base.Backend.compile_events` deltas)."""
        counter = compile_counter(delta)
        compilations = None if counter is None else int(delta[counter])
        # A cache hit compiled nothing: the first step's extra time is noise, not a shape's cost.
        seconds = 0.0 if compilations == 0 else max(0.0, first - warm)
        return cls(
            int(length),
            first,
            warm,
            seconds,
            compilations,
            delta.get("tpu_cache_hits"),
            delta.get("tpu_cache_requests"),
            counter,
            warm_compilations,
        )


def compile_counter(events: dict[str, int]) -> str | None:
    """The counter that says whether a step compiled: the device's own where it has one (TorchTPU
    counts every XLA executable it compiles, in eager mode too), else dynamo's graphs."""
    for name in ("tpu_compilations", "torch_compile_graphs"):
        if name in events:
            return name
    return None


@dataclass(frozen=True)
class BucketCostModel:
    """Compile cost of a new shape and step time against padded length (see the module's text)."""

    compile_seconds: float  # the median measured cost of a new shape (the constant without a line)
    coefficients: tuple[float, float, float]  # a, b, c of t(L) = a + b L + c L^2 (seconds)
    fit_max_relative_error: float = 0.0
    fit_points: list[tuple[int, float]] = field(default_factory=list)  # (length, measured seconds)
    compile_samples: list[tuple[int, float]] = field(default_factory=list)  # (length, measured seconds)
    compile_line: tuple[float, float] | None = None  # p, q of C(L) = p + q L (seconds); None: constant
    shapes: list[ShapeCost] = field(default_factory=list)  # each probed length as measured

    def step_seconds(self, length: float | np.ndarray) -> float | np.ndarray:
        """Steady step time at padded length `length`."""
        a, b, c = self.coefficients
        return a + b * length + c * np.square(length)

    def compile_seconds_at(self, length: float | np.ndarray) -> np.ndarray:
        """What compiling a new shape of padded length `length` costs."""
        if self.compile_line is None:
            return np.full(np.shape(length), self.compile_seconds, dtype=float)
        p, q = self.compile_line
        return p + q * np.asarray(length, dtype=float)

    def padding_seconds_per_token(self, length: float) -> float:
        """What one more padded token costs a step at `length` (the slope of t)."""
        _, b, c = self.coefficients
        return b + 2 * c * length

    def describe(self) -> str:
        """One line: the step-time fit, the compile cost and, where counted, compiles and hits."""
        a, b, c = self.coefficients
        text = (
            f"t(L) = {a * 1e3:.3g} ms + {b * 1e6:.3g} us x L + {c * 1e9:.3g} ns x L^2 "
            f"(max error {self.fit_max_relative_error:.1%} over {len(self.fit_points)} lengths); "
            f"{self.compile_seconds:.2f} s per new shape"
        )
        if self.compile_line is not None and self.compile_line[1] > 0:
            text += f" (C(L) = {self.compile_line[0]:.3g} s + {self.compile_line[1] * 1e3:.3g} ms x L)"
        counted = [s for s in self.shapes if s.counter is not None]
        if counted:
            hits = sum(1 for s in counted if s.cache_hit)
            text += (
                f"; {counted[0].counter}: {sum(1 for s in counted if s.compiled)} of {len(counted)} new shapes compiled"
            )
            text += f", {hits} cache hits (no compile cost)" if hits else ""
        return text


def fit_cost_model(
    step_points: Sequence[tuple[int, float]],
    compile_points: Sequence[tuple[int, float]],
    shapes: Sequence[ShapeCost] = (),
) -> BucketCostModel:
    """Fit t(L) by non-negative least squares, weighted by 1/t so every length's relative error
    counts alike; the compile cost is the median of the measured ones, and with two or more
    measured lengths also C(L) = p + q L by non-negative least squares."""
    if len(step_points) < 2:
        raise ValueError("fitting step time against length needs at least two measured lengths")
    lengths = np.array([p[0] for p in step_points], dtype=float)
    seconds = np.array([p[1] for p in step_points], dtype=float)
    design = np.stack([np.ones_like(lengths), lengths, lengths**2], axis=1)
    weights = 1.0 / seconds
    if len(step_points) < 3:
        design = design[:, :2]  # two points fix a line, not a parabola
    solution, _ = nnls(design * weights[:, None], seconds * weights)
    a, b, c = (float(x) for x in np.pad(solution, (0, 3 - len(solution))))
    predicted = design @ solution
    error = float(np.max(np.abs(predicted - seconds) / seconds))
    compile_seconds = float(np.median([p[1] for p in compile_points])) if compile_points else 0.0
    return BucketCostModel(
        compile_seconds,
        (a, b, c),
        error,
        [(length, secs) for length, secs in step_points],
        [(length, secs) for length, secs in compile_points],
        _compile_line(compile_points),
        list(shapes),
    )


def _compile_line(points: Sequence[tuple[int, float]]) -> tuple[float, float] | None:
    """C(L) = p + q L through the measured compile costs; None with fewer than two lengths.
    Non-negative: a longer shape never compiles for less, so noise cannot make one look free."""
    if len({p[0] for p in points}) < 2:
        return None
    lengths = np.array([p[0] for p in points], dtype=float)
    design = np.stack([np.ones_like(lengths), lengths], axis=1)
    (p, q), _ = nnls(design, np.array([p[1] for p in points], dtype=float))
    return float(p), float(q)
