"""How to run: isolated workers that measure candidates and compare them interleaved."""

from tpu_tuner.execution.measurement import Measurement, TrialFailure
from tpu_tuner.runner.trial_runner import JobResult, TrialRunner

__all__ = ["JobResult", "Measurement", "TrialFailure", "TrialRunner"]
