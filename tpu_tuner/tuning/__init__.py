"""The tuning loop: agents shape the space, Optuna searches, the verifier proves the win."""

from tpu_tuner.tuning.options import TuneOptions
from tpu_tuner.tuning.result import TuningResult
from tpu_tuner.tuning.study import Progress, tune

__all__ = ["Progress", "TuneOptions", "TuningResult", "tune"]
