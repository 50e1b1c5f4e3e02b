"""How to reproduce chosen buckets on TorchTPU.

TorchTPU's torch.compile(backend="tpu") has bounded dynamism (experimental): options
``num_dynamic_buckets`` (1..8) and ``bucket_size`` (default 128) pad a dynamic dimension up to a
multiple of bucket_size and compile one executable per bucket (torch-tpu 0.2.0's backend reads
both keys and refuses a count outside 1..8: `devices/torchtpu_api.py` checks them). Which
multiples it compiles is TorchTPU's choice, not ours, so the dependable route is explicit padding
with `pad_to_bucket`; the compile options are offered where the chosen bounds fit them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MAX_TORCHTPU_BUCKETS = 8


def torchtpu_instructions(bounds: Sequence[int]) -> str:
    """One line saying how to get these buckets on TorchTPU."""
    explicit = (
        "pad explicitly with tpu_tuner.bucketing.pad_to_bucket(sequences, BUCKETS) and compile with dynamic=False"
    )
    size = math.gcd(*bounds)
    if len(bounds) <= MAX_TORCHTPU_BUCKETS and size % 128 == 0:
        return (
            f"torch.compile(model, backend='tpu', options={{'num_dynamic_buckets': {len(bounds)}, "
            f"'bucket_size': {size}}}) compiles at most {len(bounds)} multiples of {size} (experimental; TorchTPU "
            f"picks the multiples), or {explicit}"
        )
    return f"{explicit} (the bounds are not all multiples of 128, which TorchTPU's bucket_size needs)"
