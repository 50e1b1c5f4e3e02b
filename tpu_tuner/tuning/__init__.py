"""The tuning loop: agents shape the space, Optuna searches, the verifier proves the win.

Names resolve lazily (PEP 562): `tpu_tuner.tuning.options` and `.storage` must import without
torch or optuna, so that bad options are refused in seconds (docs/run-safety.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpu_tuner.tuning.options import TuneOptions
    from tpu_tuner.tuning.progress import Progress
    from tpu_tuner.tuning.result import TuningResult

_WHERE = {"TuneOptions": "options", "TuningResult": "result", "Progress": "progress"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)


__all__ = ["Progress", "TuneOptions", "TuningResult"]
