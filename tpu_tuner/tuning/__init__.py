"""The tuning loop: agents shape the space, Optuna searches, the verifier proves the win.

Names resolve lazily (PEP 562): `tpu_tuner.tuning.options.tune_options` and `.storage` must import without
torch or optuna, so that bad options are refused in seconds (docs/run-safety.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpu_tuner.core.lazy import lazy_exports

if TYPE_CHECKING:
    from tpu_tuner.tuning.options.tune_options import TuneOptions
    from tpu_tuner.tuning.run.tuning_result import TuningResult

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "TuneOptions": f"{__name__}.options.tune_options",
        "TuningResult": f"{__name__}.run.tuning_result",
    },
)

__all__ = ["TuneOptions", "TuningResult"]
