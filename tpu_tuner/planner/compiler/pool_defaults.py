"""The compile pool's defaults, which `tpu-tune plan`'s `--workers` and `--compile-timeout` take:
how many compiler processes, and how long one compile may run.

Apart from the pool (compile_pool.py) because the plan's options read them (plans/plan_options.py)
and the pool's job type names those options (compile_request.py, `StepSettings.of`): with the
defaults in the pool, the options imported the pool, which imported the job, which named the
options, a circle.
"""

from __future__ import annotations

from tpu_tuner.core.host import usable_cores

# A compile running longer is taken as hung: its worker is killed and its job fails (the longest
# compile measured here, Gemma 4 26B on 4x8x8, took 674 s; docs/planner.md).
COMPILE_TIMEOUT_S = 3600.0


def default_workers() -> int:
    """One worker per core, at most 4 (each 70B compile holds a few GiB of host memory)."""
    return max(1, min(4, usable_cores()))


__all__ = ["COMPILE_TIMEOUT_S", "default_workers"]
