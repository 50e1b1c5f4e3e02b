"""Issue 55, item 10: MFU comparable across runs of one host. A re-probe (a step beat the cached
peak) raised the bf16 peak from 1772 to 1970 GFLOP/s between two runs an hour apart, and nothing
said so: the runs' MFU figures divided by different peaks. The probe now keeps what it replaced,
and its one-line description (the peak's source, in every profile and report) says both figures."""

from __future__ import annotations

from dataclasses import asdict

from tpu_tuner.devices.roofline_probe import RooflineProbe


def _probe(bf16: float, at: str, epoch: float) -> RooflineProbe:
    return RooflineProbe(900e9, bf16, 10e9, 1024, 64 * 2**20, 3, at, measured_at_epoch=epoch)


def test_a_raised_peak_keeps_the_figure_it_replaced_and_says_both() -> None:
    first = _probe(1772e9, "10:00", 1.0)
    raised = first.merged_with(_probe(1970e9, "11:00", 2.0))
    assert raised.bfloat16_flops_per_s == 1970e9 and raised.raised_from == {"bfloat16": 1772e9}
    assert "peak last raised at 11:00 (bfloat16 1772 -> 1970 GFLOP/s)" in raised.describe()
    # Raised again: the earliest figure stays (what the first runs divided by).
    again = raised.merged_with(_probe(2100e9, "12:00", 3.0))
    assert again.raised_from == {"bfloat16": 1772e9} and "1772 -> 2100" in again.describe()


def test_a_re_probe_that_raises_nothing_says_nothing() -> None:
    first = _probe(1970e9, "10:00", 1.0)
    same = first.merged_with(_probe(1800e9, "11:00", 2.0))  # under load: lower, never lowers the peak
    assert same.raised_from is None and "raised" not in same.describe()
    older_entry = {k: v for k, v in asdict(first).items() if k not in ("raised_from", "raised_at")}
    assert RooflineProbe(**older_entry).raised_from is None  # a cache entry written before reads
