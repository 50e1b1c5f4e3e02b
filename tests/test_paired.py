"""Paired speedup statistics."""

from __future__ import annotations

import numpy as np
import pytest

from tpu_tuner.metrics.paired import paired_speedup


def test_drift_cancels_in_paired_ratios() -> None:
    rng = np.random.default_rng(1)
    drift = np.exp(rng.normal(0, 0.4, 20))  # the machine's speed wanders by ~2x between rounds
    slow = 0.010 * drift * np.exp(rng.normal(0, 0.02, 20))
    fast = 0.005 * drift * np.exp(rng.normal(0, 0.02, 20))
    result = paired_speedup(slow, fast)
    assert result.speedup == pytest.approx(2.0, rel=0.03)
    assert result.ci_low < result.speedup < result.ci_high
    assert result.significant and result.rounds == 20


def test_no_difference_is_not_significant() -> None:
    rng = np.random.default_rng(2)
    a = 0.01 * np.exp(rng.normal(0, 0.1, 12))
    b = 0.01 * np.exp(rng.normal(0, 0.1, 12))
    result = paired_speedup(a, b)
    assert result.ci_low < 1 < result.ci_high and not result.significant


def test_needs_paired_rounds() -> None:
    with pytest.raises(ValueError):
        paired_speedup([1.0, 2.0], [1.0])
