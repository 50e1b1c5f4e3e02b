"""A tuning run's options (imports neither torch nor Optuna: bad options are refused in seconds).

The package's face: `from tpu_tuner.tuning.options import TuneOptions, SearchOptions` (the sections
live in `search_options` and `runner_options`, the whole in `tune_options`)."""

from tpu_tuner.tuning.options import tune_options
from tpu_tuner.tuning.options.tune_options import *  # noqa: F403 - the face: tune_options' public names, listed there once

__all__ = tune_options.__all__
