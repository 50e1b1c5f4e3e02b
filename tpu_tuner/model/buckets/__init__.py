"""Shape buckets in arithmetic: few compiled shapes, little padding, chosen from the real length
distribution. Imports no other room of `model/`; the measurements are `runner/bucket_jobs.py`'s and the
`tpu-tune buckets` pipeline `bucketing/`'s (docs/bucketing.md).

* `lengths.py`: a length sample (a file, or the workload's ``sample_lengths()``) as a histogram;
* `bucket_cost.py`: the compile cost per new shape and the step time against length, fitted;
* `bucket_choice.py`: the exact optimiser (dynamic programming) and the baseline strategies;
* `padding.py`: the runtime helper that pads a batch to its bucket in the user's data pipeline;
* `torchtpu_buckets.py`: how to get chosen buckets on TorchTPU.
"""
