"""Import torchax 0.0.13 on torch 2.13.

torchax 0.0.13 names, at import time, aten overloads for named tensors (``prod.dim_Dimname``,
``index_fill.Dimname_Scalar``, ``std.correction_names``, ...) that torch 2.13 removed, so its import
fails with ``AttributeError: The underlying op of 'aten.prod' has no overload name 'dim_Dimname'``
(``python -c 'import torchax'`` with those two versions shows it). Those names only fill torchax's
decomposition and autocast tables; no program can dispatch to an overload that does not exist. While
torchax imports, this module answers a lookup of such a missing *named-tensor* overload with an
inert placeholder (recorded in `SKIPPED`) and re-raises every other missing-attribute error.
"""

from __future__ import annotations

import importlib
import logging
import re
import sys
import threading
from types import ModuleType
from typing import Any

import torch

from tpu_tuner.core.errors import TpuTuneError

log = logging.getLogger(__name__)

# Overload names of the named-tensor API: Dimname, dimname, names, *_names, ...
_NAMED_OVERLOAD = re.compile(r"(^|_)(dim)?names?($|_)|Dimname|dimname", re.IGNORECASE)
SKIPPED: list[str] = []
_LOCK = threading.Lock()


class MissingOverload:
    """Stands in for an aten overload this torch does not have; never dispatched."""

    def __init__(self, qualified_name: str) -> None:
        self.qualified_name = qualified_name

    def __repr__(self) -> str:
        return f"<missing overload {self.qualified_name}>"

    def name(self) -> str:
        return self.qualified_name


def is_named_tensor_overload(name: str) -> bool:
    return bool(_NAMED_OVERLOAD.search(name)) and name != "default"


def import_torchax() -> ModuleType:
    """Import torchax, tolerating references to removed named-tensor overloads."""
    if "torchax" in sys.modules:
        return sys.modules["torchax"]
    packet_class = torch._ops.OpOverloadPacket
    original = packet_class.__getattr__

    def tolerant_getattr(self: torch._ops.OpOverloadPacket, key: str) -> Any:
        try:
            return original(self, key)
        except AttributeError:
            if is_named_tensor_overload(key):
                qualified = f"{self._qualified_op_name}.{key}"
                SKIPPED.append(qualified)
                return MissingOverload(qualified)
            raise

    with _LOCK:
        packet_class.__getattr__ = tolerant_getattr  # type: ignore[method-assign]  # for this import only
        try:
            module = importlib.import_module("torchax")
            # The environment loads torchax's op tables (decompositions, jaten, jtorch) lazily;
            # create it while the tolerant lookup is in place so those tables load too.
            module.default_env()
        except ImportError as exc:
            raise TpuTuneError(
                "the planner needs torchax (pip install 'tpu-tune[plan]' or pip install torchax==0.0.13)"
            ) from exc
        finally:
            packet_class.__getattr__ = original  # type: ignore[method-assign]  # the patch undone
    if SKIPPED:
        log.debug("torchax: skipped %d removed named-tensor overloads: %s", len(SKIPPED), ", ".join(SKIPPED))
    return module
