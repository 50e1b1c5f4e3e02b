"""Waiting for a condition another process brings about (a study record, a store key), by looking
again every so often: the one poll loop of the package."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll(check: Callable[[], T | None], every_s: float, timeout_s: float | None = None) -> T | None:
    """Call `check` every `every_s` seconds until it returns something other than None, and return
    that; after `timeout_s` (None: never) return None instead. `check` runs at least once."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        value = check()
        if value is not None or (deadline is not None and time.monotonic() >= deadline):
            return value
        time.sleep(every_s)


__all__ = ["poll"]
