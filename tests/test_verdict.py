"""The verdict follows the roofline numbers."""

from __future__ import annotations

from tpu_tuner.profiling.verdict import decide

PEAK, BANDWIDTH = 1e12, 1e11  # ridge point 10 FLOP/B


def _decide(flops: float, bytes_moved: float, step: float):
    return decide(flops, bytes_moved, step, PEAK, "float32", BANDWIDTH, ops_per_step=100, explained_share_min=0.5)


def test_compute_bound() -> None:
    verdict = _decide(flops=8e11, bytes_moved=1e9, step=1.0)  # compute 0.8 s, memory 0.01 s
    assert verdict.bound == "compute-bound" and verdict.compute_share == 0.8
    assert verdict.arithmetic_intensity == 800 and verdict.ridge_point == 10


def test_memory_bound() -> None:
    verdict = _decide(flops=1e10, bytes_moved=7e10, step=1.0)  # compute 0.01 s, memory 0.7 s
    assert verdict.bound == "memory-bound" and verdict.memory_share == 0.7


def test_overhead_bound_names_the_op_count() -> None:
    verdict = _decide(flops=1e9, bytes_moved=1e8, step=1.0)  # the roofline explains 0.1%
    assert verdict.bound == "overhead-bound"
    assert "100 ops per step" in verdict.summary
