"""The host link as a roofline: a step moves its offloaded tensors over the chip's host link while
it computes, so it takes at least that traffic's time (docs/planner.md, "an eighth session").

Offloaded activations go to the host in the forward pass and come back in the backward, over the
chip's PCIe link (a TPU7x chip's two TensorCores share it), as DMAs that XLA overlaps with the
step's compute; they cost time only where they outlast it. Google states no host-link bandwidth
for its TPU hosts. Every published run that offloads sets a lower bound on it: it moved its host
bytes within its published step. The planner takes the largest such bound among the rows it
fits (the fastest host rate a published run sustained), one for every generation: a step is
predicted no shorter than its host traffic at that rate. A lower bound, so a step it makes
host-bound is predicted pessimistically, never faster than a published run moved host bytes.
A bound from few rows is a loose one (the two Llama 4 Scout rows alone, 16 GB a step on v5p,
would put the link at 0.5 GB/s), so the roofline needs `MIN_COMPARABLE` offloading rows, as many
as a band's 90% quantile needs (band.py), and is left out where fewer offload.
"""

from __future__ import annotations

from tpu_tuner.planner.calibration.rows import CalibrationRow
from tpu_tuner.planner.prediction.band import MIN_COMPARABLE


def sustained_host_rate(row: CalibrationRow) -> float:
    """GB/s a chip the row's run moved between its chips and its host, over its published step
    (0 for a row that offloads nothing)."""
    if row.host_gbytes <= 0 or row.published_mfu <= 0:
        return 0.0
    return row.host_gbytes / (row.model_seconds_at_peak / row.published_mfu)


def host_link_bound(rows: list[CalibrationRow]) -> float:
    """The fastest host rate any of `rows` sustained (GB/s a chip): the host link's bandwidth as
    the rows bound it from below; 0 (no roofline) where fewer than `MIN_COMPARABLE` offload."""
    rates = [rate for rate in map(sustained_host_rate, rows) if rate > 0]
    return max(rates) if len(rates) >= MIN_COMPARABLE else 0.0
