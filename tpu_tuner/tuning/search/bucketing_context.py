"""Bucketing as a knob of the main tuning study, for workloads whose inputs vary in length.

With varying lengths, an execution setting's cost over the planned run depends on how many shapes
it compiles and how much padding it runs: a compiled setting pays its compile once per bucket.
Eager pays none on CPU; TorchTPU's eager modes run ops as XLA programs (its profiler shows
`tt_jit_*` executables), which may compile per new shape too, and the trial's measured compile
time (warm-up beyond its steady steps) holds whatever they cost. So when the workload has a
length sample, every trial's objective is the expected per-step time over the planned run *with
the bucketing best for that trial*, solved exactly by the DP of model/buckets/bucket_choice.py rather
than sampled: the trial's own measured compile time is the cost of a shape, and its steady step
at the reference length, scaled by the step-time-against-length curve measured once at the start
of the study, is its t(L). The chosen trial's buckets go into the
tuned config.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_tuner.model.buckets.bucket_choice import Evaluation, evaluate, optimal_buckets
from tpu_tuner.model.buckets.bucket_cost import BucketCostModel
from tpu_tuner.model.buckets.lengths import LengthHistogram


@dataclass(frozen=True)
class BucketingContext:
    """The length sample and the step-time curve every trial's objective is evaluated under."""

    hist: LengthHistogram
    shape_model: BucketCostModel  # step time against length, measured at the study's start
    reference_length: int  # the length trials are measured at
    max_buckets: int = 8
    align: int = 8

    def cost_model_for(self, step_seconds: float, compile_seconds: float) -> BucketCostModel:
        """The shape curve scaled to a trial's steady step at the reference length; where the
        curve was measured with a compile cost per length, that too is scaled to the trial's
        compile at the reference length (a long shape compiles for longer under every setting)."""
        scale = step_seconds / float(self.shape_model.step_seconds(self.reference_length))
        a, b, c = self.shape_model.coefficients
        line = self.shape_model.compile_line
        at_reference = float(self.shape_model.compile_seconds_at(self.reference_length))
        if line is not None and at_reference > 0:
            factor = compile_seconds / at_reference
            return BucketCostModel(
                compile_seconds, (a * scale, b * scale, c * scale), compile_line=(line[0] * factor, line[1] * factor)
            )
        return BucketCostModel(compile_seconds, (a * scale, b * scale, c * scale))

    def best(self, step_seconds: float, compile_seconds: float, planned_steps: int) -> Evaluation:
        """The exact best bucketing for a trial, evaluated over the planned run."""
        model = self.cost_model_for(step_seconds, compile_seconds)
        strategy = optimal_buckets(self.hist, model, planned_steps, self.max_buckets, self.align)
        return evaluate(strategy, self.hist, model, planned_steps, self.max_buckets)
