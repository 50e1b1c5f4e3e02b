"""Shape buckets in arithmetic: few compiled shapes, little padding, chosen from the real length
distribution. Imports no other room of `model/`; the measurements are `runner/bucket_jobs.py`'s and the
`tpu-tune buckets` pipeline `bucketing/`'s (docs/bucketing.md).

* `lengths.py`: a length sample (a file, or the workload's ``sample_lengths()``) as a histogram;
* `bucket_cost.py`: the compile cost per new shape and the step time against length, fitted;
* `bucket_choice.py`: the exact optimiser (dynamic programming) and the baseline strategies;
* `padding.py`: the runtime helper that pads a batch to its bucket in the user's data pipeline;
* `torchtpu_buckets.py`: how to get chosen buckets on TorchTPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpu_tuner.core.lazy import lazy_exports

if TYPE_CHECKING:
    from tpu_tuner.model.buckets.bucket_choice import evaluate, optimal_buckets
    from tpu_tuner.model.buckets.bucket_cost import BucketCostModel
    from tpu_tuner.model.buckets.lengths import LengthHistogram, read_lengths
    from tpu_tuner.model.buckets.padding import bucket_for, pad_to_bucket
    from tpu_tuner.model.buckets.torchtpu_buckets import torchtpu_instructions

# Imported on first use (PEP 562): the face imports none of its modules, and so no torch.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "LengthHistogram": f"{__name__}.lengths",
        "read_lengths": f"{__name__}.lengths",
        "BucketCostModel": f"{__name__}.bucket_cost",
        "evaluate": f"{__name__}.bucket_choice",
        "optimal_buckets": f"{__name__}.bucket_choice",
        "bucket_for": f"{__name__}.padding",
        "pad_to_bucket": f"{__name__}.padding",
        "torchtpu_instructions": f"{__name__}.torchtpu_buckets",
    },
)

__all__ = [
    "BucketCostModel",
    "LengthHistogram",
    "bucket_for",
    "evaluate",
    "optimal_buckets",
    "pad_to_bucket",
    "read_lengths",
    "torchtpu_instructions",
]
