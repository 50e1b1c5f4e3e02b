"""Shape bucketing: few compiled shapes, little padding, chosen from the real length distribution.

* `model/buckets/lengths.py`: read a length sample (a file, or the workload's ``sample_lengths()``);
* `model/buckets/bucket_cost.py`: compile cost per new shape and step time against length, fitted;
* `model/buckets/bucket_choice.py`: the exact optimiser (dynamic programming) and the baseline strategies;
* `model/buckets/padding.py`: the runtime helper that pads a batch to its bucket in the user's data pipeline;
* `runner/bucket_jobs.py`: the measurements on the present backend, in a worker;
* `bucketing/study.py`: the `tpu-tune buckets` pipeline.
"""

from tpu_tuner.model.buckets.bucket_choice import evaluate, optimal_buckets
from tpu_tuner.model.buckets.bucket_cost import BucketCostModel
from tpu_tuner.model.buckets.lengths import LengthHistogram, read_lengths
from tpu_tuner.model.buckets.padding import bucket_for, pad_to_bucket

__all__ = [
    "BucketCostModel",
    "LengthHistogram",
    "bucket_for",
    "evaluate",
    "optimal_buckets",
    "pad_to_bucket",
    "read_lengths",
]
