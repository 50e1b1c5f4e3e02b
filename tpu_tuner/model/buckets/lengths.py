"""Length samples: read from a file (CSV or one number a line) or the workload, as a histogram."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tpu_tuner.core.errors import UserInputError

# Where the bucketing cost model measures a step: the sample's extremes, median and upper tail.
PROBE_QUANTILES = (0.0, 0.5, 0.9, 0.99, 1.0)

# The longest length a sample may hold: beyond any model's context, and far inside int64, so the
# aligned probe lengths (a length rounded up to a multiple of the alignment) cannot overflow.
MAX_LENGTH = 2**31 - 1

LENGTH_COLUMNS = ("length", "lengths", "len", "seq_len", "tokens", "num_tokens")


@dataclass(frozen=True)
class LengthHistogram:
    """Distinct lengths (ascending) and how often each occurs in the sample."""

    lengths: np.ndarray  # int64, strictly increasing
    counts: np.ndarray  # int64, > 0

    @classmethod
    def from_sample(cls, sample: Sequence[int] | np.ndarray) -> LengthHistogram:
        values = np.asarray(sample)
        if values.size == 0:
            raise ValueError("the length sample is empty")
        if not np.issubdtype(values.dtype, np.number):  # text, objects, ints beyond int64
            try:
                values = values.astype(np.float64)
            except (TypeError, ValueError, OverflowError):
                raise ValueError("lengths must be whole numbers") from None
        if not np.issubdtype(values.dtype, np.integer):
            if not np.all(np.isfinite(values)) or np.any(values != np.round(values)):
                raise ValueError("lengths must be whole numbers")
        if values.min() < 1 or values.max() > MAX_LENGTH:
            raise ValueError(
                f"lengths must be from 1 to {MAX_LENGTH:,}, found {float(values.min()):g} to {float(values.max()):g}"
            )
        lengths, counts = np.unique(values.astype(np.int64), return_counts=True)
        return cls(lengths, counts.astype(np.int64))

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    @property
    def max_length(self) -> int:
        return int(self.lengths[-1])

    def probabilities(self) -> np.ndarray:
        return self.counts / self.counts.sum()

    def sample(self, n: int, seed: int = 0) -> np.ndarray:
        """`n` lengths drawn from the histogram (a replay stream)."""
        return np.random.default_rng(seed).choice(self.lengths, size=n, p=self.probabilities())


def read_lengths(path: str | Path) -> np.ndarray:
    """Lengths from a file: a CSV with a header column named like "length" (or a single column),
    or one number a line. Raises UserInputError naming the file and the problem."""
    path = Path(path)
    if not path.is_file():
        raise UserInputError("no such lengths file", path)
    text = path.read_text(errors="replace")
    rows = [(number, row) for number, row in enumerate(csv.reader(text.splitlines()), 1) if any(c.strip() for c in row)]
    if not rows:
        raise UserInputError("the lengths file is empty", path)
    column = 0
    header = [cell.strip().lower() for cell in rows[0][1]]
    if not all(_is_number(cell) for cell in header):  # a header line
        names = [cell for cell in header if cell in LENGTH_COLUMNS]
        if len(header) > 1 and not names:
            raise UserInputError(
                f"no length column: name one of {', '.join(LENGTH_COLUMNS)} (found {', '.join(header)})", path
            )
        column, rows = (header.index(names[0]) if names else 0), rows[1:]
    values = []
    for line, row in rows:
        cell = row[column].strip() if column < len(row) else ""
        if not _is_number(cell) or float(cell) != int(float(cell)) or not 1 <= float(cell) <= MAX_LENGTH:
            raise UserInputError(
                f"line {line}: {cell!r} is not a whole number of tokens from 1 to {MAX_LENGTH:,}", path
            )
        values.append(int(float(cell)))
    if not values:
        raise UserInputError("the lengths file has a header but no lengths", path)
    return np.asarray(values, dtype=np.int64)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return np.isfinite(float(text))


def probe_lengths(hist: LengthHistogram, align: int) -> list[int]:
    """Aligned lengths at the sample's quantiles (at least two distinct)."""
    sample = np.repeat(hist.lengths, hist.counts)
    values = sorted({int(-(-np.quantile(sample, q, method="higher") // align) * align) for q in PROBE_QUANTILES})
    if len(values) < 2:
        values.append(values[-1] + align)
    return values


def bucket_histogram(workload: Any, lengths_file: Path | None) -> LengthHistogram:
    """The length sample of `lengths_file`, else of the workload's sample_lengths()."""
    if lengths_file is not None:
        sample = read_lengths(lengths_file)
        source: Any = lengths_file
    elif workload.sample_lengths is not None:
        try:
            sample = np.asarray(list(workload.sample_lengths()))
        except Exception as exc:
            raise UserInputError(f"sample_lengths() failed: {type(exc).__name__}: {exc}", workload.source) from exc
        source = workload.source
    else:
        raise UserInputError(
            "no length sample: give --lengths FILE or define sample_lengths() in the file", workload.source
        )
    try:
        return LengthHistogram.from_sample(sample)
    except ValueError as exc:
        raise UserInputError(str(exc), source) from exc
