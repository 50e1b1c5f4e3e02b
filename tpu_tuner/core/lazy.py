"""A package's public names imported on first use (PEP 562), so that importing the package
imports none of the modules behind them (torch, mostly: seconds a process)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level `__getattr__` and `__dir__` of `package` for `exports` (public name -> the
    module that defines it): a name's module is imported at its first use, and the value kept in
    the package's namespace (later uses cost nothing)."""
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = namespace[name] = getattr(importlib.import_module(exports[name]), name)
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__


__all__ = ["lazy_exports"]
