"""A tuning run's options (imports neither torch nor Optuna: bad options are refused in seconds).

The package's face: `from tpu_tuner.tuning.options import TuneOptions, SearchOptions` (the sections
live in `search_options` and `runner_options`, the whole in `tune_options`)."""

from tpu_tuner.tuning.options.tune_options import (
    PLAIN_KEYS,
    SECTIONS,
    ObjectiveOptions,
    OutputOptions,
    RunnerOptions,
    SearchOptions,
    StoreOptions,
    TuneOptions,
    default_trial_settings,
)

__all__ = [
    "PLAIN_KEYS",
    "SECTIONS",
    "ObjectiveOptions",
    "OutputOptions",
    "RunnerOptions",
    "SearchOptions",
    "StoreOptions",
    "TuneOptions",
    "default_trial_settings",
]
