"""What the bucketing study measured on the device, in lines for the terminal.

The per-shape figures (first step, warm step, compile seconds, the backend's compile and
cache-hit counters), what padding costs (the step-time curve's slope and the chosen buckets'
padding over the planned run) and, per chosen bucket, its compile amortised over the steps it
is expected to take against its padding: the trade the optimiser made.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpu_tuner.bucketing.study import BucketResult


def measurement_lines(result: BucketResult) -> list[str]:
    """The measured compile cost of each probed shape, the padding cost and each chosen bucket's
    compile against its padding, naming the device."""
    model = result.cost_model
    name = result.device_name or result.device
    lines = [
        f"measured on {name} ({result.device}, torch.compile backend {result.compile_backend!r}, static shapes): "
        "what a new shape cost"
    ]
    if model.shapes:
        counter = next((s.counter for s in model.shapes if s.counter), None)
        rows = [
            [
                str(s.length),
                _s(s.first_seconds),
                _s(s.warm_seconds),
                _s(s.compile_seconds),
                _count(s.compilations),
                _count(s.cache_hits),
            ]
            for s in model.shapes
        ]
        lines += _table(["length", "first step s", "warm step s", "compile s", "compilations", "cache hits"], rows)
        lines.append(
            f"  compile s = first step - warm step where {counter} counted a compilation, 0 on a cache hit"
            if counter
            else "  compile s = first step - warm step (this backend counts no compilations: unconfirmed)"
        )
    chosen = result.chosen
    median = result.length_summary.get("median", 0.0)
    lines.append(
        f"padding: {model.padding_seconds_per_token(median) * 1e6:.3g} us per padded token at the median length "
        f"{median:.0f}; the chosen buckets pad {chosen.padding_waste:.1%} of tokens, "
        f"{_s(chosen.padding_seconds)} s over {result.steps} steps, against {_s(chosen.compile_seconds)} s "
        f"compiling {chosen.compiled_shapes} shape{'' if chosen.compiled_shapes == 1 else 's'}"
    )
    if result.chosen_shares:
        lines.append("chosen buckets, compile amortised over their expected steps against their padding:")
        rows = [
            [
                str(share.bound),
                f"{share.expected_steps:,.0f}",
                _s(share.compile_seconds),
                _s(share.compile_per_step),
                _s(share.padding_seconds),
                _s(share.padding_per_step),
            ]
            for share in result.chosen_shares
        ]
        lines += _table(["bound", "expected steps", "compile s", "per step", "padding s", "per step"], rows)
    return lines


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in [list(headers), *rows]]


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _s(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}" if value >= 1 else f"{value:.3g}"
