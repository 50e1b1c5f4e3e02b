"""Facts of the host at hand read from the operating system, without importing torch."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model_name() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (the platform's processor name elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """Cores this process may run on (a container or taskset can allow fewer than exist)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
