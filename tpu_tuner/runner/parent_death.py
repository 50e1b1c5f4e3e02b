"""A child process that dies with the process that started it."""

from __future__ import annotations

import os
import signal
import sys


def die_with_parent(variable: str) -> None:
    """In a child, first thing: be killed when the parent whose pid is in `variable` dies
    (Linux's PR_SET_PDEATHSIG). Children that lead sessions of their own (trial workers, ranks)
    hear no terminal's signal, so a parent killed with SIGKILL would leave them running, holding
    the device or their peers' collectives; a parent already gone by now ends the child at once."""
    parent = os.environ.get(variable)
    if not sys.platform.startswith("linux") or parent is None:
        return
    import ctypes

    pr_set_pdeathsig = 1  # <linux/prctl.h>
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != int(parent):
        os._exit(1)
